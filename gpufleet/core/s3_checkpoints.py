"""Checkpoints on an S3 object store (boto3), in the one manifest format (core.checkpoint_manifest).

Layout in a bucket: `<prefix><stem>/<file>` for every shard and the metadata, and
`<prefix><stem>/MANIFEST.json` written LAST with one PUT: S3 makes an object visible whole or not
at all, so a checkpoint whose manifest exists had every file uploaded first; one without is a save
that was cut off (incomplete). Verification streams every object and compares its sha256 with the
manifest's (never its size or its ETag: radosgw's ETag of a multipart upload is not an MD5 of the
object).

A copy to another store (a backup, a restore) verifies the source against its manifest while
reading, writes the files, reads the copy back and verifies it, and writes the manifest last.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.core import s3
from gpufleet.core.checkpoint_manifest import (
    Candidate,
    CheckpointManifest,
    Choice,
    build_manifest,
    candidates_of,
    choose_newest_verified,
    manifest_matches,
    parse_manifest,
    parse_stem,
    sha256_stream,
    stem,
    verify,
)
from gpufleet.core.storage_contract import StorageSandboxState

MANIFEST = "MANIFEST.json"


def missing_key(e: ClientError) -> bool:
    """Whether S3 answered that the key is not there (radosgw: NoSuchKey on GET, 404 on HEAD)."""
    return str(e.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404", "NotFound")


@dataclass
class S3CheckpointStore:
    client: Any  # a boto3 S3 client (gpufleet.core.s3.client)
    bucket: str
    prefix: str = ""

    def key(self, ckpt_stem: str, name: str) -> str:
        return f"{self.prefix}{ckpt_stem}/{name}"

    # ------------------------------------------------------------------ writing
    def put(
        self, ckpt: tuple[int, int, int], shards: Mapping[str, bytes], metadata: bytes, written_at: float
    ) -> CheckpointManifest:
        """Upload every file, then the manifest (multipart above core.s3's threshold)."""
        manifest = build_manifest(*ckpt, shards, ("metadata.json", metadata), written_at)
        name = stem(ckpt)
        for fname, data in [*shards.items(), ("metadata.json", metadata)]:
            self.client.upload_fileobj(
                io.BytesIO(data), self.bucket, self.key(name, fname), Config=s3.transfer_config()
            )
        self.client.put_object(Bucket=self.bucket, Key=self.key(name, MANIFEST), Body=manifest.to_bytes())
        return manifest

    def delete(self, ckpt: tuple[int, int, int]) -> None:
        """Remove a checkpoint, manifest first (so it is never seen complete with files missing)."""
        name = stem(ckpt)
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name, MANIFEST))
        keys = [o["Key"] for o in self._list(f"{self.prefix}{name}/")]
        for k in keys:
            self.client.delete_object(Bucket=self.bucket, Key=k)

    # ------------------------------------------------------------------ reading
    def _list(self, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(page.get("Contents", []))
        return out

    def manifest(self, ckpt: tuple[int, int, int]) -> CheckpointManifest | str | None:
        """The manifest, why it is unreadable, or None when there is none."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(stem(ckpt), MANIFEST))["Body"]
        except ClientError as e:
            if missing_key(e):
                return None
            raise
        got = parse_manifest(body.read())
        if isinstance(got, str):
            return got
        return manifest_matches(got, ckpt) or got

    def candidates(self) -> list[Candidate]:
        """Every checkpoint with any object under the prefix: with its manifest, or why it has none."""
        stems: set[tuple[int, int, int]] = set()
        for o in self._list(self.prefix):
            rest = str(o["Key"])[len(self.prefix) :]
            parsed = parse_stem(rest.split("/", 1)[0])
            if parsed is not None:
                stems.add(parsed)
        return candidates_of(stems, self.manifest)

    def complete(self) -> list[CheckpointManifest]:
        """Manifests of the checkpoints that have one (not verified), oldest first."""
        return [c.manifest for c in self.candidates() if c.manifest is not None]

    def sha256_of(self, ckpt_stem: str, name: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(ckpt_stem, name))["Body"]
        except ClientError as e:
            if missing_key(e):
                return None
            raise
        digest, _ = sha256_stream(body)
        return digest

    def verify(self, manifest: CheckpointManifest) -> list[str]:
        name = stem((manifest.job, manifest.restart, manifest.step))
        return verify(manifest, lambda f: self.sha256_of(name, f))

    def newest_verified(self) -> Choice:
        return choose_newest_verified(self.candidates(), self.verify)

    # ------------------------------------------------------------------ copying
    def copy_to(self, manifest: CheckpointManifest, dest: S3CheckpointStore) -> list[str]:
        """Copy one checkpoint to `dest`, verified at both ends; problems (empty: copied and the copy
        verified). Nothing of a source that does not verify is left complete at the destination."""
        name = stem((manifest.job, manifest.restart, manifest.step))
        for f in manifest.files():
            try:
                data = self.client.get_object(Bucket=self.bucket, Key=self.key(name, f.name))["Body"].read()
            except ClientError as e:
                return [f"{f.name}: {'missing' if missing_key(e) else e} at the source"]
            got, _ = sha256_stream(io.BytesIO(data))
            if got != f.sha256:
                return [f"{f.name}: the source does not match its manifest (sha256 {got[:12]}...)"]
            dest.client.upload_fileobj(
                io.BytesIO(data), dest.bucket, dest.key(name, f.name), Config=s3.transfer_config()
            )
        problems = dest.verify(manifest)
        if problems:
            return [f"the copy does not verify: {p}" for p in problems]
        dest.client.put_object(Bucket=dest.bucket, Key=dest.key(name, MANIFEST), Body=manifest.to_bytes())
        return []


def store_for(
    state: StorageSandboxState, bucket: str, prefix: str = "", attempts: int = 2
) -> S3CheckpointStore:
    """A store on the storage sandbox's radosgw, with its S3 user's keys."""
    creds = state.credentials()
    if state.s3_endpoint is None:
        raise RuntimeError(f"the storage sandbox of {state.stack} has no S3 endpoint yet")
    client = s3.client(
        state.s3_endpoint, creds.access_key, creds.secret_key, attempts=attempts, read_timeout_s=10.0
    )
    return S3CheckpointStore(client, bucket, prefix)
