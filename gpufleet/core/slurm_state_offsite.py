"""Off-host copies of the Slurm state backups, in the storage sandbox's backup bucket.

A backup kept only on the controller's host is lost with that host. So when the stack's storage
sandbox is up, every verified backup of StateSaveLocation (core.slurm_state_backups) is copied to
`<backup bucket>/slurm-state/`. The order is the archive, then a read-back checked against the
evidence's sha256, then the evidence. The evidence is written last: an archive whose evidence is
missing was never vouched for. A restore that finds no usable backup on the host fetches the newest
verified off-host copy whose archive still matches its sha256 (ADR 0069).

boto3 through core.s3 (explicit retries and timeouts); the bucket is versioned, so a pruned copy
stays as a noncurrent version until the bucket's lifecycle removes it.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.core.offsite import put_verified
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.core.slurm_backup_checks import (
    ARCHIVE_PREFIX,
    EVIDENCE_SUFFIX,
    StateBackupEvidence,
    evidence_name,
    to_prune,
)
from gpufleet.core.slurm_state_backups import KEEP, SlurmBackupError
from gpufleet.core.storage_contract import read_storage_state, storage_state_path

PREFIX = "slurm-state/"
S3_ERRORS = (ClientError, BotoCoreError, OSError)


def offsite_for(stack: str, root: Path | None) -> tuple[Any, str] | None:
    """A boto3 client and the backup bucket of the stack's storage sandbox, when one is up."""
    if not storage_state_path(stack, root).exists():
        return None
    try:
        storage = read_storage_state(stack, root)
    except (OSError, ValueError):
        return None
    if storage.phase != "up" or storage.backup_bucket is None or storage.s3_endpoint is None:
        return None
    return store_for(storage, storage.backup_bucket).client, storage.backup_bucket


def ship(client: Any, bucket: str, folder: Path, evidence: StateBackupEvidence) -> dict[str, Any]:
    """Copy one verified backup off the host; what happened, for the backup job's events."""
    t0 = time.monotonic()
    key = PREFIX + evidence.archive
    problem = put_verified(client, bucket, key, folder / evidence.archive, evidence.sha256)
    if problem is None:
        client.put_object(Bucket=bucket, Key=PREFIX + evidence_name(evidence.archive),
                          Body=evidence.model_dump_json(indent=1).encode())
    return {"bucket": bucket, "key": key, "verified": problem is None,
            "seconds": round(time.monotonic() - t0, 3), **({} if problem is None else {"problem": problem})}


def list_offsite(client: Any, bucket: str) -> list[StateBackupEvidence]:
    """Every off-host backup's evidence, oldest first (unreadable ones skipped)."""
    out: list[StateBackupEvidence] = []
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + ARCHIVE_PREFIX)
    for page in pages:
        for obj in page.get("Contents", []):
            if not str(obj["Key"]).endswith(EVIDENCE_SUFFIX):
                continue
            try:
                raw = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                out.append(StateBackupEvidence.model_validate_json(raw))
            except (*S3_ERRORS, ValueError):
                continue
    return sorted(out, key=lambda e: (e.taken_at, e.archive))


def prune_offsite(client: Any, bucket: str, keep: int = KEEP) -> None:
    for e in to_prune(list_offsite(client, bucket), keep):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [
            {"Key": PREFIX + evidence_name(e.archive)}, {"Key": PREFIX + e.archive}]})


def fetch_newest(client: Any, bucket: str, folder: Path) -> StateBackupEvidence:
    """Bring the newest verified off-host backup whose archive matches its sha256 into `folder`
    (archive, then its evidence), for core.slurm_state_backups.restore_newest to extract.
    SlurmBackupError when the bucket holds none."""
    folder.mkdir(parents=True, exist_ok=True)
    why: list[str] = []
    for e in sorted((e for e in list_offsite(client, bucket) if e.verified), key=lambda e: e.taken_at,
                    reverse=True):
        try:
            body = client.get_object(Bucket=bucket, Key=PREFIX + e.archive)["Body"].read()
        except S3_ERRORS as err:
            why.append(f"{e.archive}: {err}")
            continue
        if hashlib.sha256(body).hexdigest() != e.sha256:
            why.append(f"{e.archive}: its sha256 differs from the evidence")
            continue
        vouched = e.model_dump_json(indent=1).encode()
        for name, data in ((e.archive, body), (evidence_name(e.archive), vouched)):
            tmp = folder / f".{name}.part"
            tmp.write_bytes(data)
            os.replace(tmp, folder / name)
        return e
    detail = f" ({'; '.join(why)})" if why else ""
    raise SlurmBackupError(f"no verified off-host state backup in s3://{bucket}/{PREFIX}{detail}")
