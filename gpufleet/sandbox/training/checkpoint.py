"""Checkpoints that survive crashes and split-brain: atomic, checksummed, fenced by job generation.

Layout of the checkpoint directory (the manifest format is gpufleet.core.checkpoint_manifest's):
  ckpt-<job>-<restart>-<step>.pt         shard: model and optimizer state (torch.save bytes)
  ckpt-<job>-<restart>-<step>.meta.json  metadata: step, world size, node, when
  ckpt-<job>-<restart>-<step>.json       manifest, written LAST: sha256 of the shard and the metadata
  fence/gen-<job>-<restart>              one empty marker per generation that has started

A generation is (Slurm job id, SLURM_RESTART_COUNT): job ids grow, and a requeue raises the restart
count, so a newer incarnation always has a larger generation. The fence is the largest marker
present; markers are only ever added (O_EXCL create), so the fence never goes backwards and needs no
lock. A writer checks the fence before and after writing and creates its files with link(2), which
never replaces an existing file: a stale rank (the old copy of a requeued job still running on a
cut-off node, sandbox-notes.md item 11) can neither overwrite a checkpoint nor leave one that a
newer generation would resume from. Resume takes the newest VALID checkpoint by (generation, step);
a checkpoint whose manifest is missing (a save cut off) or whose files do not match their sha256
is skipped. The read side (names, checks, newest valid) is gpufleet.core.job_checkpoints, which the
drills verify the job's checkpoints with.

A stack whose checkpoint location is `s3://` gives the job a bucket prefix instead of a folder
(CheckpointPrefix, ADR 0070): the same rules, in core.s3_job_checkpoints' layout.
"""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.core import s3
from gpufleet.core.checkpoint_manifest import CheckpointManifest, build_manifest, metadata_doc
from gpufleet.core.durable_files import create_no_replace, fsync_dir
from gpufleet.core.job_checkpoints import (
    CheckpointReader,
    CkptKey,
    Gen,
    JobCheckpoints,
    Loaded,
    check_manifest,
    metadata_name,
    parse_manifest_name,
    shard_name,
)
from gpufleet.core.s3 import read_location
from gpufleet.core.s3_checkpoints import MANIFEST
from gpufleet.core.s3_job_checkpoints import FENCE_FOLDER, S3JobCheckpoints

# Names the training job and its tests take from here, as before the read side moved to core.
__all__ = [
    "CheckpointDir",
    "CheckpointPrefix",
    "CkptKey",
    "Decision",
    "Gen",
    "Loaded",
    "StaleGeneration",
    "check_manifest",
    "fence_name",
    "make_manifest",
    "may_write",
    "newest",
    "open_store",
    "parse_fence_name",
    "parse_manifest_name",
    "to_prune",
]

_FENCE = re.compile(r"^gen-(\d{10})-(\d{6})$")


class StaleGeneration(Exception):
    """This rank belongs to a generation older than the fence: it must stop, not write."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


# --------------------------------------------------------------------------- pure decisions


def fence_name(gen: Gen) -> str:
    return f"gen-{gen[0]:010d}-{gen[1]:06d}"


def parse_fence_name(name: str) -> Gen | None:
    m = _FENCE.match(name)
    return (int(m[1]), int(m[2])) if m else None


def may_write(mine: Gen, step: int, fence: Gen | None, existing: Iterable[CkptKey]) -> Decision:
    """Whether generation `mine` may write its checkpoint of `step`.

    Denied when a newer generation has started (fence), when a checkpoint of a newer generation
    exists, or when this generation already has a checkpoint at this step or later."""
    if fence is not None and fence > mine:
        return Decision(False, f"generation {mine} is stale: generation {fence} has started")
    for k in existing:
        if k.gen > mine:
            return Decision(False, f"a newer generation {k.gen} wrote step {k.step}")
        if k.gen == mine and k.step >= step:
            return Decision(False, f"step {k.step} of this generation already exists")
    return Decision(True, "ok")


def newest(valid: Iterable[CkptKey]) -> CkptKey | None:
    return max(valid, default=None)


def to_prune(valid: Sequence[CkptKey], keep: int) -> list[CkptKey]:
    """Older checkpoints beyond the newest `keep` (never the newest one)."""
    ordered = sorted(valid, reverse=True)
    return sorted(ordered[max(keep, 1):])


def make_manifest(key: CkptKey, payload: bytes, meta: dict[str, Any], written_at: float) -> tuple[
        bytes, CheckpointManifest]:
    """The metadata bytes and the manifest of checkpoint `key` with one shard, `payload`."""
    meta_bytes = metadata_doc({"job": key.job, "restart": key.restart, "step": key.step, **meta})
    manifest = build_manifest(key.job, key.restart, key.step, {shard_name(key): payload},
                              (metadata_name(key), meta_bytes), written_at)
    return meta_bytes, manifest


# --------------------------------------------------------------------------- I/O


class _FencedWriter(CheckpointReader):
    """The job's write rules over any store: fence markers only ever added, the fence checked
    before and after each write, a write of a stale generation withdrawn, pruning by the current
    generation only. A store gives the primitives below."""

    def fence_names(self) -> list[str]:
        raise NotImplementedError

    def add_fence(self, name: str) -> None:
        """Create the marker (an existing one is left as it is)."""
        raise NotImplementedError

    def put(self, key: CkptKey, payload: bytes, meta: bytes, manifest: CheckpointManifest) -> None:
        """The shard and the metadata durable first, the manifest last; never replace a file."""
        raise NotImplementedError

    def remove(self, key: CkptKey) -> None:
        """Remove a checkpoint, its manifest first."""
        raise NotImplementedError

    def fence(self) -> Gen | None:
        gens = [g for g in (parse_fence_name(n) for n in self.fence_names()) if g is not None]
        return max(gens, default=None)

    def claim(self, gen: Gen) -> None:
        """Record that `gen` has started; raises StaleGeneration if a newer one already has."""
        self.add_fence(fence_name(gen))
        current = self.fence()
        if current is not None and current > gen:
            raise StaleGeneration(f"generation {gen} is stale: generation {current} has started")

    def write(self, gen: Gen, step: int, payload: bytes, meta: dict[str, Any]) -> CkptKey:
        """Write checkpoint `step` of generation `gen`; raises StaleGeneration when fenced."""
        key = CkptKey(gen[0], gen[1], step)
        decision = may_write(gen, step, self.fence(), self.keys())
        if not decision.allowed:
            raise StaleGeneration(decision.reason)
        meta_bytes, manifest = make_manifest(key, payload, meta, time.time())
        self.put(key, payload, meta_bytes, manifest)
        fence = self.fence()
        if fence is not None and fence > gen:
            # A newer generation started while we wrote: withdraw our files (names unique to us).
            self.remove(key)
            raise StaleGeneration(f"generation {fence} started while generation {gen} wrote step {step}")
        return key

    def prune(self, gen: Gen, keep: int) -> list[CkptKey]:
        """Remove old checkpoints (only the current generation prunes)."""
        if self.fence() != gen:
            return []
        valid = [k for k in self.keys() if isinstance(self.load(k), Loaded)]
        gone = to_prune(valid, keep)
        for k in gone:
            self.remove(k)
        return gone


class CheckpointDir(_FencedWriter, JobCheckpoints):
    """The folder as the training job writes it: link(2) no-replace writes, fsync'd."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.fence_dir = root / "fence"
        self.fence_dir.mkdir(parents=True, exist_ok=True)

    def fence_names(self) -> list[str]:
        return [p.name for p in self.fence_dir.iterdir()]

    def add_fence(self, name: str) -> None:
        try:
            fd = os.open(self.fence_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            fsync_dir(self.fence_dir)
        except FileExistsError:
            pass

    def put(self, key: CkptKey, payload: bytes, meta: bytes, manifest: CheckpointManifest) -> None:
        create_no_replace(self.root / shard_name(key), payload)
        create_no_replace(self.root / metadata_name(key), meta)
        fsync_dir(self.root)  # the files are durable before the manifest that vouches for them
        create_no_replace(self.root / f"{key.stem}.json", manifest.to_bytes())
        fsync_dir(self.root)

    def remove(self, key: CkptKey) -> None:
        for suffix in (".json", ".meta.json", ".pt"):
            (self.root / f"{key.stem}{suffix}").unlink(missing_ok=True)


class CheckpointPrefix(_FencedWriter, S3JobCheckpoints):
    """A bucket prefix as the training job writes it (core.s3_job_checkpoints' layout). S3 (Ceph 16's
    radosgw) has no create-if-absent PUT, so no-replace rests on names: every name carries the
    generation and the step, a generation writes a step once (may_write), and the manifest is one
    PUT written last, visible whole or not at all."""

    def fence_names(self) -> list[str]:
        return S3JobCheckpoints.fence_names(self)

    def add_fence(self, name: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{FENCE_FOLDER}{name}", Body=b"")

    def put(self, key: CkptKey, payload: bytes, meta: bytes, manifest: CheckpointManifest) -> None:
        for name, data in ((shard_name(key), payload), (metadata_name(key), meta)):
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, self.store.key(key.stem, name),
                                       Config=s3.transfer_config())
        self.client.put_object(Bucket=self.bucket, Key=self.store.key(key.stem, MANIFEST),
                               Body=manifest.to_bytes())

    def remove(self, key: CkptKey) -> None:
        self.store.delete((key.job, key.restart, key.step))


def open_store(checkpoint_dir: Path, s3_location: Path | None) -> CheckpointDir | CheckpointPrefix:
    """The job's store: the bucket prefix its S3 location file names, else its folder."""
    if s3_location is None:
        return CheckpointDir(checkpoint_dir)
    loc = read_location(s3_location)
    # A job's save must fail fast when radosgw is down (it keeps training and tries again at the
    # next interval), so one attempt and short timeouts; core.s3 says why each is explicit.
    client = s3.client(loc.endpoint, loc.access_key, loc.secret_key, attempts=1,
                       connect_timeout_s=2.0, read_timeout_s=5.0)
    return CheckpointPrefix(client, loc.bucket, loc.prefix)
