"""Diagnostic bundles copied off the node into a bucket, before remediation can wipe the node.

A bundle is collected before the drain. Remediation may then reboot or reimage the node, and a
bundle left only on the node's disk goes with it. So when the node is given a ship target, the hook
copies each bundle to `<prefix><node>/<bundle name>` (core.offsite: upload, read back, sha256
compared with the file's), then writes `<that key>.json` last: the bundle's manifest with the
archive's sha256 and when it was shipped. An archive with no `.json` beside it was never vouched
for. boto3 through core.s3: one attempt, short timeouts (the hook runs before a drain, on its clock).

The target (endpoint, bucket, prefix, keys: core.s3.S3Location) is a JSON file of mode 0600. On the
sandbox, `sandbox up` writes one when the stack's storage sandbox is up: `bundles/` of its backup
bucket, reached from the node's own loopback through the relay of ADR 0070.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from gpufleet.core import s3
from gpufleet.core.offsite import put_verified
from gpufleet.core.s3 import S3Location, read_location
from gpufleet.fleet.bundle.model import Manifest


class ShipError(ValueError):
    """The ship target file is unreadable or invalid."""


def read_target(path: Path) -> S3Location:
    try:
        return read_location(path)
    except OSError as e:
        raise ShipError(f"{path}: {e.strerror}") from None
    except ValidationError as e:
        where = ", ".join(".".join(str(p) for p in err["loc"]) + f": {err['msg']}" for err in e.errors())
        raise ShipError(f"{path}: {where}") from None


def bundle_key(target: S3Location, manifest: Manifest, path: Path) -> str:
    return f"{target.prefix}{manifest.node}/{path.name}"


def evidence_doc(manifest: Manifest, path: Path, sha256: str, shipped_at: float) -> bytes:
    return json.dumps({"bundle": path.name, "sha256": sha256, "bytes": path.stat().st_size,
                       "shipped_at": shipped_at, "manifest": manifest.model_dump(mode="json")},
                      sort_keys=True, indent=1).encode()


def ship(client: Any, target: S3Location, path: Path, manifest: Manifest) -> dict[str, Any]:
    """Copy one bundle off the node; what happened (never raises for S3's answers)."""
    t0 = time.monotonic()
    key = bundle_key(target, manifest, path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        problem = put_verified(client, target.bucket, key, path, sha)
        if problem is None:
            client.put_object(Bucket=target.bucket, Key=key + ".json",
                              Body=evidence_doc(manifest, path, sha, time.time()))
    except (ClientError, BotoCoreError, OSError) as e:
        problem = f"{type(e).__name__}: {e}"[:300]
    return {"url": f"s3://{target.bucket}/{key}", "verified": problem is None, "sha256": sha,
            "seconds": round(time.monotonic() - t0, 3), **({} if problem is None else {"problem": problem})}


def client_for(target: S3Location) -> Any:
    return s3.client(target.endpoint, target.access_key, target.secret_key, attempts=1,
                     connect_timeout_s=2.0, read_timeout_s=5.0)
