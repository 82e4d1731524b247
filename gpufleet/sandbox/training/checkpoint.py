"""Checkpoints that survive crashes and split-brain: atomic, checksummed, fenced by job generation.

Layout of the checkpoint directory:
  ckpt-<job>-<restart>-<step>.pt     payload (torch.save bytes)
  ckpt-<job>-<restart>-<step>.json   manifest, written LAST: {"sha256", "size", "step", ...}
  fence/gen-<job>-<restart>          one empty marker per generation that has started

A generation is (Slurm job id, SLURM_RESTART_COUNT): job ids grow, and a requeue raises the restart
count, so a newer incarnation always has a larger generation. The fence is the largest marker
present; markers are only ever added (O_EXCL create), so the fence never goes backwards and needs no
lock. A writer checks the fence before and after writing and creates its files with link(2), which
never replaces an existing file: a stale rank (the old copy of a requeued job still running on a
cut-off node, sandbox-notes.md item 11) can neither overwrite a checkpoint nor leave one that a
newer generation would resume from. Resume takes the newest VALID checkpoint by (generation, step);
a checkpoint whose manifest is missing or whose payload does not match its sha256 is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Gen = tuple[int, int]  # (job id, restart count)
_NAME = re.compile(r"^ckpt-(\d{10})-(\d{6})-(\d{9})\.json$")
_FENCE = re.compile(r"^gen-(\d{10})-(\d{6})$")


@dataclass(frozen=True, order=True)
class CkptKey:
    job: int
    restart: int
    step: int

    @property
    def gen(self) -> Gen:
        return (self.job, self.restart)

    @property
    def stem(self) -> str:
        return f"ckpt-{self.job:010d}-{self.restart:06d}-{self.step:09d}"


class StaleGeneration(Exception):
    """This rank belongs to a generation older than the fence: it must stop, not write."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


# --------------------------------------------------------------------------- pure decisions


def parse_manifest_name(name: str) -> CkptKey | None:
    m = _NAME.match(name)
    return CkptKey(int(m[1]), int(m[2]), int(m[3])) if m else None


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


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_doc(key: CkptKey, data: bytes, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": 1,
        "job": key.job,
        "restart": key.restart,
        "step": key.step,
        "payload": key.stem + ".pt",
        "size": len(data),
        "sha256": sha256_hex(data),
        **meta,
    }


def check_manifest(key: CkptKey, doc: Any, payload: bytes | None) -> str | None:
    """Why a checkpoint is invalid, or None when it is valid."""
    if not isinstance(doc, dict):
        return "manifest is not a JSON object"
    if (doc.get("job"), doc.get("restart"), doc.get("step")) != (key.job, key.restart, key.step):
        return "manifest does not match its file name"
    if payload is None:
        return "payload missing"
    if doc.get("size") != len(payload):
        return f"payload has {len(payload)} bytes, manifest says {doc.get('size')}"
    if doc.get("sha256") != sha256_hex(payload):
        return "payload sha256 does not match the manifest"
    return None


# --------------------------------------------------------------------------- I/O


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_no_replace(final: Path, data: bytes) -> None:
    """Write to a private temp file, fsync, then link(2) it into place: fails with FileExistsError
    instead of replacing an existing file (rename(2) would replace it)."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Loaded:
    key: CkptKey
    payload: bytes
    manifest: dict[str, Any]


class CheckpointDir:
    def __init__(self, root: Path) -> None:
        self.root = root
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
            _fsync_dir(self.fence_dir)
        except FileExistsError:
            pass
        current = self.fence()
        if current is not None and current > gen:
            raise StaleGeneration(f"generation {gen} is stale: generation {current} has started")

    # listing and validation
    def keys(self) -> list[CkptKey]:
        return sorted(k for k in (parse_manifest_name(p.name) for p in self.root.iterdir()) if k is not None)

    def load(self, key: CkptKey) -> Loaded | str:
        """The checkpoint, or why it is invalid."""
        try:
            doc = json.loads((self.root / f"{key.stem}.json").read_text())
        except (OSError, ValueError) as e:
            return f"manifest unreadable: {e}"
        try:
            payload: bytes | None = (self.root / f"{key.stem}.pt").read_bytes()
        except OSError:
            payload = None
        why = check_manifest(key, doc, payload)
        if why is not None:
            return why
        assert payload is not None
        return Loaded(key, payload, doc)

    def newest_valid(self) -> tuple[Loaded | None, list[tuple[CkptKey, str]]]:
        """The newest valid checkpoint, and the newer ones skipped with the reason."""
        skipped: list[tuple[CkptKey, str]] = []
        for key in sorted(self.keys(), reverse=True):
            got = self.load(key)
            if isinstance(got, Loaded):
                return got, skipped
            skipped.append((key, got))
        return None, skipped

    # writing
    def write(self, gen: Gen, step: int, payload: bytes, meta: dict[str, Any]) -> CkptKey:
        """Write checkpoint `step` of generation `gen`; raises StaleGeneration when fenced."""
        key = CkptKey(gen[0], gen[1], step)
        decision = may_write(gen, step, self.fence(), self.keys())
        if not decision.allowed:
            raise StaleGeneration(decision.reason)
        _create_no_replace(self.root / f"{key.stem}.pt", payload)
        _create_no_replace(self.root / f"{key.stem}.json",
                           json.dumps(manifest_doc(key, payload, meta), sort_keys=True).encode())
        _fsync_dir(self.root)
        fence = self.fence()
        if fence is not None and fence > gen:
            # A newer generation started while we wrote: withdraw our files (names unique to us).
            for suffix in (".json", ".pt"):
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
            for suffix in (".json", ".pt"):
                (self.root / f"{k.stem}{suffix}").unlink(missing_ok=True)
        return gone
