"""Checkpoints in a directory of a mounted file system (the storage sandbox's JuiceFS mount), in the
one manifest format (core.checkpoint_manifest) and the same layout as on S3 (core.s3_checkpoints):
`<dir>/<stem>/<file>` for every shard and the metadata, `<dir>/<stem>/MANIFEST.json` written LAST.

Every file is written to a temporary name, fsync'd and renamed; the manifest is made visible with
link(2) of its fsync'd temporary file, which never replaces an existing one, and the folder is
fsync'd: a checkpoint whose manifest exists had every file durable first. JuiceFS gives close-to-open
consistency and makes fsync durable in the object store and the metadata engine (JuiceFS docs,
"Consistency"), so the same rule holds on the mount as on a local disk.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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
from gpufleet.core.durable_files import create_no_replace, fsync_dir, replace_durably
from gpufleet.core.s3_checkpoints import MANIFEST, S3CheckpointStore, store_for
from gpufleet.core.storage_contract import StorageSandboxState


@dataclass
class FsCheckpointStore:
    root: Path

    def folder(self, ckpt_stem: str) -> Path:
        return self.root / ckpt_stem

    # ------------------------------------------------------------------ writing
    def put(
        self, ckpt: tuple[int, int, int], shards: Mapping[str, bytes], metadata: bytes, written_at: float
    ) -> CheckpointManifest:
        manifest = build_manifest(*ckpt, shards, ("metadata.json", metadata), written_at)
        d = self.folder(stem(ckpt))
        d.mkdir(parents=True, exist_ok=True)
        for fname, data in [*shards.items(), ("metadata.json", metadata)]:
            replace_durably(d / fname, data)
        fsync_dir(d)  # the files are durable before the manifest that vouches for them
        create_no_replace(d / MANIFEST, manifest.to_bytes())  # never replaces a manifest already there
        fsync_dir(d)
        return manifest

    def delete(self, ckpt: tuple[int, int, int]) -> None:
        """Manifest first, so the checkpoint is never seen complete with files missing."""
        d = self.folder(stem(ckpt))
        (d / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ reading
    def manifest(self, ckpt: tuple[int, int, int]) -> CheckpointManifest | str | None:
        try:
            raw = (self.folder(stem(ckpt)) / MANIFEST).read_bytes()
        except FileNotFoundError:
            return None
        got = parse_manifest(raw)
        if isinstance(got, str):
            return got
        return manifest_matches(got, ckpt) or got

    def candidates(self) -> list[Candidate]:
        """Every checkpoint folder: with its manifest, or why it has none. OSError when the file
        system does not answer (an unmounted or broken JuiceFS: ENOTCONN)."""
        stems = sorted(k for k in (parse_stem(e.name) for e in os.scandir(self.root) if e.is_dir()) if k)
        return candidates_of(stems, self.manifest)

    def complete(self) -> list[CheckpointManifest]:
        return [c.manifest for c in self.candidates() if c.manifest is not None]

    def sha256_of(self, ckpt_stem: str, name: str) -> str | None:
        try:
            with open(self.folder(ckpt_stem) / name, "rb") as fh:
                digest, _ = sha256_stream(fh)
        except FileNotFoundError:
            return None
        return digest

    def verify(self, manifest: CheckpointManifest) -> list[str]:
        name = stem((manifest.job, manifest.restart, manifest.step))
        return verify(manifest, lambda f: self.sha256_of(name, f))

    def newest_verified(self) -> Choice:
        return choose_newest_verified(self.candidates(), self.verify)

    # ------------------------------------------------------------------ copying
    def copy_to(self, manifest: CheckpointManifest, dest: S3CheckpointStore) -> list[str]:
        """Copy one checkpoint to an S3 store (a backup), verified at both ends, manifest last."""
        name = stem((manifest.job, manifest.restart, manifest.step))
        for f in manifest.files():
            try:
                data = (self.folder(name) / f.name).read_bytes()
            except FileNotFoundError:
                return [f"{f.name}: missing at the source"]
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


def checkpoint_store_of(state: StorageSandboxState) -> FsCheckpointStore | S3CheckpointStore:
    """Where the storage sandbox's checkpoints live: the JuiceFS mount's folder when the stack
    checkpoints to JuiceFS, else the checkpoint bucket (direct S3)."""
    if state.juicefs is not None and state.juicefs.checkpoint_dir is not None:
        return FsCheckpointStore(Path(state.juicefs.checkpoint_dir))
    if state.checkpoint_bucket is None:
        raise RuntimeError(f"the storage sandbox of {state.stack} has no checkpoint bucket yet")
    return store_for(state, state.checkpoint_bucket)
