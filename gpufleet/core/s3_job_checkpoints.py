"""A training job's checkpoints straight on S3, read side: where they are (the job's S3 location
file) and a CheckpointReader over a bucket prefix.

A stack whose `storage.checkpoint.location` is `s3://<bucket>/<folder>` runs its training job with
checkpoints under `<folder>/job-<run id>/` of that bucket, in core.s3_checkpoints' layout
(`<stem>/<file>`, `<stem>/MANIFEST.json` written last with one PUT, so a checkpoint whose manifest
exists was uploaded whole), and with the job's fence as empty objects `fence/gen-<job>-<restart>`.
The writer (fencing, pruning) is the training job's own (gpufleet.sandbox.training.checkpoint); the
readers here are also the backup's, the restore's and the drills' (chaos may not import the
sandbox).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from gpufleet.core import s3
from gpufleet.core.checkpoint_manifest import parse_stem
from gpufleet.core.job_checkpoints import JOB_FOLDER_PREFIX, CheckpointReader, CkptKey
from gpufleet.core.s3 import S3Location
from gpufleet.core.s3_checkpoints import MANIFEST, S3CheckpointStore, missing_key

FENCE_FOLDER = "fence/"
# The port radosgw answers on by default (Ceph docs, "Ceph Object Gateway Config Reference":
# rgw_frontends "beast port=7480"). Inside a sandbox node's namespace the job reaches the storage
# sandbox's radosgw on this port of the namespace's own loopback (the relay of sandbox.storage.s3_job).
NODE_S3_PORT = 7480


def parse_s3_url(url: str) -> tuple[str, str] | None:
    """(bucket, folder) of `s3://<bucket>/<folder>`; None for another scheme or no folder."""
    parts = urlsplit(url)
    folder = parts.path.strip("/")
    if parts.scheme != "s3" or not parts.netloc or not folder or ".." in folder.split("/"):
        return None
    return parts.netloc, folder


def job_prefix(folder: str, run_id: str) -> str:
    return f"{folder.strip('/')}/{JOB_FOLDER_PREFIX}{run_id}/"


def list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(str(o["Key"]) for o in page.get("Contents", []))
    return out


def job_prefixes(client: Any, bucket: str, under: str = "") -> list[str]:
    """The training jobs' prefixes (`.../job-<run id>/`) in a bucket, below `under`: every key's
    folder part up to a `job-` component that holds a checkpoint or a fence."""
    found: set[str] = set()
    for key in list_keys(client, bucket, under):
        parts = key[len(under):].split("/")
        for i, part in enumerate(parts[:-1]):
            if part.startswith(JOB_FOLDER_PREFIX):
                found.add(under + "/".join(parts[: i + 1]) + "/")
                break
    return sorted(found)


class S3JobCheckpoints(CheckpointReader):
    """The checkpoints of one job's prefix, read only (every call is one or a few S3 requests)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.store = S3CheckpointStore(client, bucket, prefix)
        self.client, self.bucket, self.prefix = client, bucket, prefix

    def _stems(self, complete: bool) -> list[CkptKey]:
        out: set[CkptKey] = set()
        for key in list_keys(self.client, self.bucket, self.prefix):
            head, _, name = key[len(self.prefix):].partition("/")
            parsed = parse_stem(head)
            if parsed is not None and (not complete or name == MANIFEST):
                out.add(CkptKey(*parsed))
        return sorted(out)

    def keys(self) -> list[CkptKey]:
        return self._stems(complete=True)

    def stems(self) -> list[CkptKey]:
        return self._stems(complete=False)

    def _get(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as e:
            if missing_key(e):
                return None
            raise

    def manifest_bytes(self, key: CkptKey) -> bytes | str:
        got = self._get(self.store.key(key.stem, MANIFEST))
        return "no manifest" if got is None else got

    def read(self, key: CkptKey, name: str) -> bytes | None:
        return self._get(self.store.key(key.stem, name))

    def fence_names(self) -> list[str]:
        return [k[len(self.prefix) + len(FENCE_FOLDER):]
                for k in list_keys(self.client, self.bucket, self.prefix + FENCE_FOLDER)]


def reader_for(location: S3Location, endpoint: str | None = None, attempts: int = 2) -> S3JobCheckpoints:
    """A reader of the job's prefix; `endpoint` overrides the location's (a rank's loopback port is
    not the root namespace's radosgw address)."""
    client = s3.client(endpoint or location.endpoint, location.access_key, location.secret_key,
                       attempts=attempts, read_timeout_s=10.0)
    return S3JobCheckpoints(client, location.bucket, location.prefix)


def copy_fence(src: S3CheckpointStore, dst: S3CheckpointStore) -> list[str]:
    """Copy the job's fence markers the destination lacks (a backup, a restore); the names copied.
    Without them a restored prefix would have no fence: the job's pruning (the current generation
    only) would stop, and a stale generation's writes would not be refused."""
    have = set(S3JobCheckpoints(dst.client, dst.bucket, dst.prefix).fence_names())
    copied = [n for n in S3JobCheckpoints(src.client, src.bucket, src.prefix).fence_names() if n not in have]
    for name in copied:
        dst.client.put_object(Bucket=dst.bucket, Key=f"{dst.prefix}{FENCE_FOLDER}{name}", Body=b"")
    return copied
