"""A training job's checkpoints in one folder, read side: names, manifests checked by sha256, and the
newest valid checkpoint. The writer (fencing, no-replace writes, pruning) is the training job's own,
gpufleet.sandbox.training.checkpoint; the readers here are also the drills' and the restores', which
verify the job's checkpoints after a storage fault (chaos may not import the sandbox).

Layout of the folder (the manifest format is gpufleet.core.checkpoint_manifest's):
  ckpt-<job>-<restart>-<step>.pt         shard: model and optimizer state (torch.save bytes)
  ckpt-<job>-<restart>-<step>.meta.json  metadata: step, world size, node, when
  ckpt-<job>-<restart>-<step>.json       manifest, written LAST: sha256 of the shard and the metadata
  fence/gen-<job>-<restart>              one empty marker per generation that has started
A checkpoint whose manifest is missing (a save cut off) or whose files do not match their sha256
is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.checkpoint_manifest import (
    CheckpointManifest,
    HashOf,
    manifest_matches,
    parse_manifest,
    parse_stem,
    sha256_bytes,
    stem,
    verify,
)

Gen = tuple[int, int]  # (job id, restart count)
_NAME = re.compile(r"^ckpt-(\d{10})-(\d{6})-(\d{9})\.json$")


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
        return stem((self.job, self.restart, self.step))


def parse_manifest_name(name: str) -> CkptKey | None:
    m = _NAME.match(name)
    return CkptKey(int(m[1]), int(m[2]), int(m[3])) if m else None


def shard_name(key: CkptKey) -> str:
    return key.stem + ".pt"


def metadata_name(key: CkptKey) -> str:
    return key.stem + ".meta.json"


def check_manifest(key: CkptKey, raw: bytes, hash_of: HashOf) -> CheckpointManifest | str:
    """The checkpoint's manifest when every file it names verifies by sha256, else why not."""
    got = parse_manifest(raw)
    if isinstance(got, str):
        return got
    why = manifest_matches(got, (key.job, key.restart, key.step))
    if why is not None:
        return why
    if shard_name(key) not in {f.name for f in got.shards}:
        return f"manifest does not name the shard {shard_name(key)}"
    problems = verify(got, hash_of)
    return "; ".join(problems) if problems else got


@dataclass(frozen=True)
class Loaded:
    key: CkptKey
    payload: bytes
    manifest: CheckpointManifest


class CheckpointReader:
    """The read side common to every store of the job's checkpoints: a store gives its complete
    checkpoints (`keys`), every checkpoint with any file (`stems`), and the bytes of one file."""

    def keys(self) -> list[CkptKey]:
        """Every complete checkpoint (its manifest exists)."""
        raise NotImplementedError

    def stems(self) -> list[CkptKey]:
        """Every checkpoint with any file, complete or not (a save cut off leaves a shard or
        metadata and no manifest)."""
        raise NotImplementedError

    def manifest_bytes(self, key: CkptKey) -> bytes | str:
        """The manifest's bytes, or why they cannot be read."""
        raise NotImplementedError

    def read(self, key: CkptKey, name: str) -> bytes | None:
        """One file of the checkpoint, None when it is missing."""
        raise NotImplementedError

    def has_manifest(self, key: CkptKey) -> bool:
        return not isinstance(self.manifest_bytes(key), str)

    def load(self, key: CkptKey) -> Loaded | str:
        """The checkpoint, or why it is invalid (no manifest: the save was cut off; a file missing
        or with another sha256: corrupt)."""
        raw = self.manifest_bytes(key)
        if isinstance(raw, str):
            return f"manifest unreadable: {raw}"
        files: dict[str, bytes] = {}

        def hash_of(name: str) -> str | None:
            data = self.read(key, name)
            if data is None:
                return None
            files[name] = data
            return sha256_bytes(data)

        got = check_manifest(key, raw, hash_of)
        if isinstance(got, str):
            return got
        return Loaded(key, files[shard_name(key)], got)

    def newest_valid(self) -> tuple[Loaded | None, list[tuple[CkptKey, str]]]:
        """The newest valid checkpoint, and the newer ones skipped with the reason (incomplete:
        no manifest; corrupt: a file missing or not matching its sha256)."""
        skipped: list[tuple[CkptKey, str]] = []
        complete = set(self.keys())
        for key in sorted(set(self.stems()) | complete, reverse=True):
            if key not in complete:
                skipped.append((key, "incomplete: no manifest (the save was cut off)"))
                continue
            got = self.load(key)
            if isinstance(got, Loaded):
                return got, skipped
            skipped.append((key, got))
        return None, skipped

    def verify_all(self) -> tuple[list[Loaded], list[tuple[CkptKey, str]]]:
        """Every complete checkpoint checked by sha256: the ones that verify, and the ones that do
        not with why. A checkpoint whose manifest went away while it was checked was pruned by its
        job (retention, not corruption) and is in neither list."""
        good: list[Loaded] = []
        bad: list[tuple[CkptKey, str]] = []
        for key in self.keys():
            got = self.load(key)
            if isinstance(got, Loaded):
                good.append(got)
            elif self.has_manifest(key):
                bad.append((key, got))
        return good, bad

    def recheck(self, key: CkptKey) -> dict[str, str | None]:
        """One checkpoint as the store holds it now: {stem: None} when it verifies, {stem: why} when
        it does not, {} when its job pruned it (its manifest is gone, before or during the check)."""
        if not self.has_manifest(key):
            return {}
        got = self.load(key)
        if isinstance(got, Loaded):
            return {key.stem: None}
        return {key.stem: got} if self.has_manifest(key) else {}


class JobCheckpoints(CheckpointReader):
    """The checkpoints of one folder, read only."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self) -> list[CkptKey]:
        return sorted(k for k in (parse_manifest_name(p.name) for p in self.root.iterdir()) if k is not None)

    def stems(self) -> list[CkptKey]:
        out = set()
        for p in self.root.iterdir():
            parsed = parse_stem(p.name.split(".", 1)[0])
            if parsed is not None:
                out.add(CkptKey(*parsed))
        return sorted(out)

    def manifest_bytes(self, key: CkptKey) -> bytes | str:
        try:
            return (self.root / f"{key.stem}.json").read_bytes()
        except OSError as e:
            return str(e)

    def read(self, key: CkptKey, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except OSError:
            return None


# A Slurm sandbox's training job checkpoints on a JuiceFS volume in a folder of this prefix (under
# the stack's checkpoint folder, gpufleet.sandbox.storage.juicefs.training_checkpoint_dir).
JOB_FOLDER_PREFIX = "job-"


def job_folders(checkpoint_dir: Path) -> list[Path]:
    """The training jobs' folders beside a checkpoint writer's checkpoints."""
    return sorted(p for p in checkpoint_dir.glob(f"{JOB_FOLDER_PREFIX}*") if p.is_dir())


def verify_folder(root: Path) -> tuple[list[Loaded], list[tuple[CkptKey, str]]]:
    """Every complete checkpoint of a folder checked by sha256 (CheckpointReader.verify_all)."""
    return JobCheckpoints(root).verify_all()
