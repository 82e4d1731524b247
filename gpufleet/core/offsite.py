"""One way to copy a file off its host into a bucket and know the copy is good: upload it, read it
back, and compare sha256 with the local file's. The caller writes what vouches for the copy (its
evidence, its manifest) only after this says the copy verified, so an object with no evidence beside
it was never vouched for. Used by the Slurm state backups (core.slurm_state_offsite) and the
diagnostic bundles (fleet.bundle.ship)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def put_verified(client: Any, bucket: str, key: str, path: Path, sha256: str) -> str | None:
    """Upload `path` to `key` and read it back: None when the copy's sha256 is `sha256`, else why not."""
    client.upload_file(str(path), bucket, key)
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    got = hashlib.sha256(body).hexdigest()
    return None if got == sha256 else f"read back with sha256 {got}, not {sha256}"
