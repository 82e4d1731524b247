"""A checkpoint's manifest: the one proof that a checkpoint is complete and intact.

A checkpoint is a set of files (shards: model, optimizer state, ...) plus one metadata document
(JSON: step, world size, when). Its manifest names every one of them with its sha256 and is
written LAST, in one atomic step (link(2) of a fsync'd temp file on a file system; one PUT on an
object store, which S3 makes visible whole or not at all). So:

- no manifest -> the save was cut off (kill -9, node crash, store outage): the checkpoint is
  INCOMPLETE and skipped;
- a manifest whose files are missing or whose sha256 differ -> CORRUPT, skipped;
- resume and restore take the newest checkpoint that verifies.

Integrity is decided by sha256 alone, never by size: a file of the right size with the wrong bytes
(a torn write that was padded, a bit flip, a copy that stopped at the right length) is corrupt.
The sizes are recorded for people and for throughput figures only.

Writers and readers (the training job's checkpoint directory, the S3 checkpoint store, backups and
drills) share this model, so one format crosses every process and storage boundary.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST_FORMAT = 2
CHUNK = 1 << 20  # bytes read at a time when hashing a stream

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# A file name inside a checkpoint: no directory part, so a manifest cannot point outside its
# checkpoint (a restore writes these names under its own prefix).
FileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileDigest(_M):
    name: FileName
    sha256: Sha256Hex
    bytes: Annotated[int, Field(ge=0)]  # informational: integrity is the sha256


class CheckpointManifest(_M):
    format: Literal[2] = 2  # MANIFEST_FORMAT
    job: Annotated[int, Field(ge=0)]
    restart: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    shards: Annotated[list[FileDigest], Field(min_length=1)]
    metadata: FileDigest
    written_at: float  # Unix time the manifest was made: the checkpoint's age for RPO

    def files(self) -> list[FileDigest]:
        return [*self.shards, self.metadata]

    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files())

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    """(sha256, bytes read) of a stream, read in CHUNK pieces (checkpoints can be large)."""
    h = hashlib.sha256()
    n = 0
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def digest(name: str, data: bytes) -> FileDigest:
    return FileDigest(name=name, sha256=sha256_bytes(data), bytes=len(data))


def build_manifest(
    job: int,
    restart: int,
    step: int,
    shards: Mapping[str, bytes],
    metadata: tuple[str, bytes],
    written_at: float,
) -> CheckpointManifest:
    """The manifest of a checkpoint whose files are given in memory."""
    return CheckpointManifest(
        job=job,
        restart=restart,
        step=step,
        shards=[digest(n, d) for n, d in sorted(shards.items())],
        metadata=digest(*metadata),
        written_at=written_at,
    )


def parse_manifest(raw: bytes) -> CheckpointManifest | str:
    """The manifest, or why these bytes are not one (a reason, never an exception)."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        return f"manifest is not JSON: {e}"
    if not isinstance(doc, dict):
        return "manifest is not a JSON object"
    if doc.get("format") != MANIFEST_FORMAT:
        return f"manifest format {doc.get('format')!r}, this gpufleet reads format {MANIFEST_FORMAT}"
    try:
        m = CheckpointManifest.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"manifest invalid at {where}: {first['msg']}"
    names = [f.name for f in m.files()]
    if len(set(names)) != len(names):
        return "manifest names a file twice"
    return m


# What a reader can say about one file: its sha256, or None when the file is missing.
HashOf = Callable[[str], str | None]


def verify(manifest: CheckpointManifest, hash_of: HashOf) -> list[str]:
    """Problems with the checkpoint's files (empty: every file present with its recorded sha256)."""
    problems = []
    for f in manifest.files():
        got = hash_of(f.name)
        if got is None:
            problems.append(f"{f.name}: missing")
        elif got != f.sha256:
            problems.append(f"{f.name}: sha256 {got[:12]}... is not the manifest's {f.sha256[:12]}...")
    return problems


@dataclass(frozen=True)
class Candidate:
    """One checkpoint as a reader found it: its sort key, and its manifest or why it has none."""

    key: tuple[int, int, int]  # (job, restart, step): a newer generation sorts after an older one
    manifest: CheckpointManifest | None
    problem: str | None  # None with a manifest: not yet verified


def candidates_of(
    stems: Iterable[tuple[int, int, int]],
    manifest: Callable[[tuple[int, int, int]], CheckpointManifest | str | None],
) -> list[Candidate]:
    """The checkpoints a store lists, oldest first, each with its manifest (`manifest` returns it,
    why it is unreadable, or None when there is none) or why it has none."""
    out = []
    for ckpt in sorted(stems):
        m = manifest(ckpt)
        if isinstance(m, CheckpointManifest):
            out.append(Candidate(ckpt, m, None))
        else:
            out.append(Candidate(ckpt, None, m or "incomplete: no manifest (the save was cut off)"))
    return out


@dataclass(frozen=True)
class Choice:
    chosen: Candidate | None
    skipped: tuple[tuple[tuple[int, int, int], str], ...]  # newer ones passed over, with why


def choose_newest_verified(
    candidates: Iterable[Candidate], check: Callable[[CheckpointManifest], list[str]]
) -> Choice:
    """The newest candidate whose manifest verifies; newer ones without a manifest (incomplete) or
    whose files do not verify (corrupt) are skipped with their reason. `check` is called newest
    first and stops at the first good one (verifying costs a read of every byte)."""
    skipped: list[tuple[tuple[int, int, int], str]] = []
    for c in sorted(candidates, key=lambda c: c.key, reverse=True):
        if c.manifest is None:
            skipped.append((c.key, c.problem or "incomplete: no manifest"))
            continue
        problems = check(c.manifest)
        if problems:
            skipped.append((c.key, "corrupt: " + "; ".join(problems)))
            continue
        return Choice(c, tuple(skipped))
    return Choice(None, tuple(skipped))


def manifest_matches(manifest: CheckpointManifest, key: tuple[int, int, int]) -> str | None:
    """Why a manifest does not belong to the checkpoint its name says, or None."""
    if (manifest.job, manifest.restart, manifest.step) != key:
        return f"manifest is of {manifest.job}/{manifest.restart}/{manifest.step}, its name says {key}"
    return None


_STEM = re.compile(r"^ckpt-(\d{10})-(\d{6})-(\d{9})$")


def stem(key: tuple[int, int, int]) -> str:
    """The name every store gives checkpoint (job, restart, step): sorts by generation then step."""
    return f"ckpt-{key[0]:010d}-{key[1]:06d}-{key[2]:09d}"


def parse_stem(name: str) -> tuple[int, int, int] | None:
    m = _STEM.match(name)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def metadata_doc(manifest_fields: Mapping[str, Any]) -> bytes:
    """Metadata bytes as written: sorted JSON, so the same metadata hashes the same."""
    return json.dumps(dict(manifest_fields), sort_keys=True).encode()
