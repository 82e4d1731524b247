"""The Slurm sandbox's training job checkpointing straight to S3 (ADR 0070).

When `storage.checkpoint.location` is `s3://<bucket>/<folder>`, the job's checkpoints go to
`<folder>/job-<run id>/` of the storage sandbox's checkpoint bucket, through boto3 from every rank.
The ranks run in the nodes' namespaces, which have no route to the root namespace (sandbox/network.py);
the storage sandbox's radosgw listens on the root namespace's loopback. A relay (portforward
--out-of) listens on port NODE_S3_PORT of each node's own loopback and connects to radosgw: a rank
reaches S3 at http://127.0.0.1:7480 and nothing else of the root namespace.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.s3_job_checkpoints import NODE_S3_PORT, S3Location, job_prefix, parse_s3_url
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.processes import Started, spawn


@dataclass(frozen=True)
class S3Target:
    location: S3Location  # as the ranks see it (their loopback's relay port)
    radosgw_port: int  # the root namespace's radosgw, where the relay connects


def job_target(
    stack_name: str, spec: StackSpec, storage: StorageSandboxState | None, run_id: str
) -> S3Target | None:
    """Where the job checkpoints when the stack's location is `s3://`, else None. InputError when the
    location is malformed, names another bucket than the storage sandbox's, or the storage sandbox
    is not up: never a silent fallback to a local folder."""
    loc = spec.storage.checkpoint.location
    if not loc.startswith("s3://"):
        return None
    parsed = parse_s3_url(loc)
    if parsed is None:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location", f"{loc!r}: expected s3://<bucket>/<folder>")])
    bucket, folder = parsed
    if storage is None or storage.phase != "up" or storage.s3_endpoint is None:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location",
                    f"{loc!r}: the training job checkpoints on the storage sandbox's object store, which "
                    f"is not up: run `gpufleet sandbox up --storage --stack {stack_name}` first")])
    if bucket != storage.checkpoint_bucket:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location",
                    f"{loc!r} names bucket {bucket!r}; the storage sandbox's checkpoint bucket is "
                    f"{storage.checkpoint_bucket!r} (storage.ceph.objectStore)")])
    port = urlsplit(storage.s3_endpoint).port
    if port is None:
        raise InputError(f"stack {stack_name}", [
            Problem("storage", f"the storage sandbox's S3 endpoint {storage.s3_endpoint!r} names no port")])
    creds = storage.credentials()
    location = S3Location(endpoint=f"http://127.0.0.1:{NODE_S3_PORT}", bucket=bucket,
                          prefix=job_prefix(folder, run_id), access_key=creds.access_key,
                          secret_key=creds.secret_key)
    return S3Target(location, port)


def write_location(path: Path, location: S3Location) -> None:
    """The ranks' location file, mode 0600 from its creation (it holds the S3 user's keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(location.model_dump_json(indent=2) + "\n")


def start_relay(namespaces: list[str], radosgw_port: int, port_file: Path, log: Path,
                python: str = sys.executable) -> Started:
    """One process relaying NODE_S3_PORT of every namespace's loopback to radosgw."""
    argv = [python, "-m", "gpufleet.sandbox.portforward", "--listen-port", str(NODE_S3_PORT),
            "--target-port", str(radosgw_port), "--port-file", str(port_file)]
    for ns in namespaces:
        argv += ["--out-of", ns]
    return spawn("portforward@radosgw", argv, log)
