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
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.core.checkpoint_manifest import CheckpointManifest, build_manifest, metadata_doc
from gpufleet.core.durable_files import create_no_replace, fsync_dir
from gpufleet.core.job_checkpoints import (
    CkptKey,
    Gen,
    JobCheckpoints,
    Loaded,
    check_manifest,
    metadata_name,
    parse_manifest_name,
    shard_name,
)

# Names the training job and its tests take from here, as before the read side moved to core.
__all__ = [
    "CheckpointDir",
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


class CheckpointDir(JobCheckpoints):
    """The folder as the training job writes it: fenced, no-replace writes, pruning."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.fence_dir = root / "fence"
        self.fence_dir.mkdir(parents=True, exist_ok=True)

    # fence
    def fence(self) -> Gen | None:
        gens = [g for g in (parse_fence_name(p.name) for p in self.fence_dir.iterdir()) if g is not None]
        return max(gens, default=None)

    def claim(self, gen: Gen) -> None:
        """Record that `gen` has started; raises StaleGeneration if a newer one already has."""
        try:
            fd = os.open(self.fence_dir / fence_name(gen), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            fsync_dir(self.fence_dir)
        except FileExistsError:
            pass
        current = self.fence()
        if current is not None and current > gen:
            raise StaleGeneration(f"generation {gen} is stale: generation {current} has started")

    # writing
    def write(self, gen: Gen, step: int, payload: bytes, meta: dict[str, Any]) -> CkptKey:
        """Write checkpoint `step` of generation `gen`; raises StaleGeneration when fenced."""
        key = CkptKey(gen[0], gen[1], step)
        decision = may_write(gen, step, self.fence(), self.keys())
        if not decision.allowed:
            raise StaleGeneration(decision.reason)
        meta_bytes, manifest = make_manifest(key, payload, meta, time.time())
        create_no_replace(self.root / shard_name(key), payload)
        create_no_replace(self.root / metadata_name(key), meta_bytes)
        fsync_dir(self.root)  # the files are durable before the manifest that vouches for them
        create_no_replace(self.root / f"{key.stem}.json", manifest.to_bytes())
        fsync_dir(self.root)
        fence = self.fence()
        if fence is not None and fence > gen:
            # A newer generation started while we wrote: withdraw our files (names unique to us).
            for suffix in (".json", ".meta.json", ".pt"):
                (self.root / f"{key.stem}{suffix}").unlink(missing_ok=True)
            raise StaleGeneration(f"generation {fence} started while generation {gen} wrote step {step}")
        return key

    def prune(self, gen: Gen, keep: int) -> list[CkptKey]:
        """Remove old checkpoints (only the current generation prunes)."""
        if self.fence() != gen:
            return []
        valid = [k for k in self.keys() if isinstance(self.load(k), Loaded)]
        gone = to_prune(valid, keep)
        for k in gone:
            for suffix in (".json", ".meta.json", ".pt"):
                (self.root / f"{k.stem}{suffix}").unlink(missing_ok=True)
        return gone
