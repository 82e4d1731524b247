"""Checkpoint logic: atomic no-replace writes, checksums, resume from the newest VALID checkpoint,
and fencing of stale generations (split-brain, sandbox-notes.md item 11)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.core.checkpoint_manifest import sha256_bytes
from gpufleet.sandbox.training.checkpoint import (
    CheckpointDir,
    CkptKey,
    Loaded,
    StaleGeneration,
    check_manifest,
    make_manifest,
    may_write,
    parse_manifest_name,
    to_prune,
)

K = CkptKey


@pytest.mark.parametrize(
    ("mine", "step", "fence", "existing", "allowed"),
    [
        ((7, 0), 20, None, [], True),
        ((7, 0), 20, (7, 0), [K(7, 0, 10)], True),
        ((7, 1), 20, (7, 1), [K(7, 0, 40)], True),  # older generation ahead in steps: still ours
        ((7, 0), 40, (7, 1), [], False),  # stale: a newer incarnation has started
        ((7, 0), 40, (7, 0), [K(7, 1, 20)], False),  # a newer generation already wrote
        ((7, 0), 40, (8, 0), [], False),  # a newer job id is newer, whatever its restart count
        ((8, 0), 40, (7, 5), [K(7, 5, 100)], True),
        ((7, 0), 20, (7, 0), [K(7, 0, 20)], False),  # never overwrite
        ((7, 0), 20, (7, 0), [K(7, 0, 30)], False),  # never go back within a generation
    ],
)
def test_may_write_table(mine: tuple[int, int], step: int, fence: tuple[int, int] | None,
                         existing: list[CkptKey], allowed: bool) -> None:
    assert may_write(mine, step, fence, existing).allowed is allowed


def test_names_prune_and_manifest_checks() -> None:
    k = K(12, 3, 400)
    assert parse_manifest_name(k.stem + ".json") == k
    assert parse_manifest_name(k.stem + ".pt") is None
    assert parse_manifest_name("ckpt-1-2-3.json") is None
    keys = [K(1, 0, 10), K(1, 0, 20), K(1, 1, 5), K(2, 0, 1)]
    assert to_prune(keys, 2) == [K(1, 0, 10), K(1, 0, 20)]
    assert to_prune(keys, 0) == sorted(keys)[:-1]  # the newest is never pruned
    meta, manifest = make_manifest(k, b"abc", {"world_size": 2}, 1000.0)
    raw = manifest.to_bytes()

    def files(shard: bytes | None, metadata: bytes | None = meta) -> dict[str, bytes | None]:
        return {k.stem + ".pt": shard, k.stem + ".meta.json": metadata}

    def check(key: CkptKey, fs: dict[str, bytes | None]) -> object:
        return check_manifest(key, raw, lambda n: None if fs.get(n) is None else sha256_bytes(fs[n] or b""))

    assert check(k, files(b"abc")) == manifest
    assert "sha256" in str(check(k, files(b"abd")))
    # Same size, other bytes: caught by the checksum (never by size).
    assert "sha256" in str(check(k, files(b"abc", meta.replace(b"2", b"3"))))
    assert "missing" in str(check(k, files(None)))
    assert "name says" in str(check(K(12, 3, 401), files(b"abc")))


def test_write_is_complete_and_never_replaces(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path)
    d.claim((5, 0))
    key = d.write((5, 0), 10, b"payload-10", {"world_size": 2})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        key.stem + ".json", key.stem + ".meta.json", key.stem + ".pt"]
    got = d.load(key)
    assert isinstance(got, Loaded) and got.payload == b"payload-10"
    assert json.loads((tmp_path / f"{key.stem}.meta.json").read_bytes())["world_size"] == 2
    assert got.manifest.metadata.sha256 == sha256_bytes((tmp_path / f"{key.stem}.meta.json").read_bytes())
    with pytest.raises(StaleGeneration, match="already exists"):
        d.write((5, 0), 10, b"other", {})
    assert (tmp_path / f"{key.stem}.pt").read_bytes() == b"payload-10"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_resume_takes_the_newest_valid_and_skips_corrupt_and_partial(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path)
    d.claim((5, 0))
    for step in (10, 20, 30, 40):
        d.write((5, 0), step, f"p{step}".encode(), {})
    # 40: payload corrupted after the manifest was written (bit rot / torn write)
    (tmp_path / f"{K(5, 0, 40).stem}.pt").write_bytes(b"p4X")
    # 50: partial write - payload there, manifest never made it
    (tmp_path / f"{K(5, 0, 50).stem}.pt").write_bytes(b"p50")
    # 45: manifest that is not JSON
    (tmp_path / f"{K(5, 0, 45).stem}.json").write_text("{not json")
    loaded, skipped = d.newest_valid()
    assert loaded is not None and loaded.key == K(5, 0, 30) and loaded.payload == b"p30"
    assert [k for k, _ in skipped] == [K(5, 0, 50), K(5, 0, 45), K(5, 0, 40)]
    assert "incomplete" in skipped[0][1] and "sha256" in skipped[2][1]


def test_resume_prefers_newer_generation_over_higher_step(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path)
    d.claim((5, 0))
    d.write((5, 0), 60, b"old-60", {})
    d.claim((5, 1))
    d.write((5, 1), 40, b"new-40", {})
    loaded, _ = d.newest_valid()
    assert loaded is not None and loaded.key == K(5, 1, 40)


def test_stale_rank_cannot_write_after_a_newer_generation_claims(tmp_path: Path) -> None:
    old, new = CheckpointDir(tmp_path), CheckpointDir(tmp_path)
    old.claim((9, 0))
    old.write((9, 0), 20, b"g0-20", {})
    new.claim((9, 1))  # the requeued job starts elsewhere
    with pytest.raises(StaleGeneration, match="stale"):
        old.write((9, 0), 40, b"g0-40", {})  # the cut-off copy reaches its next checkpoint
    with pytest.raises(StaleGeneration):
        old.claim((9, 0))  # and may not start again either
    new.write((9, 1), 40, b"g1-40", {})
    assert new.keys() == [K(9, 0, 20), K(9, 1, 40)]
    assert old.prune((9, 0), 1) == []  # a stale generation never deletes anything
    assert new.prune((9, 1), 1) == [K(9, 0, 20)]


def test_writer_withdraws_when_fenced_during_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = CheckpointDir(tmp_path)
    d.claim((3, 0))
    real_link = os.link
    calls = []

    def link_then_fence(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_link(src, dst)
        calls.append(dst)
        # the new incarnation claims while we write the manifest
        if str(dst).endswith(".json") and not str(dst).endswith(".meta.json"):
            (tmp_path / "fence" / "gen-0000000003-000001").touch()

    monkeypatch.setattr(os, "link", link_then_fence)
    with pytest.raises(StaleGeneration, match="started while"):
        d.write((3, 0), 20, b"late", {})
    assert len(calls) == 3  # shard, metadata, manifest
    assert d.keys() == []  # withdrawn: nothing a newer generation could resume from


def test_fence_only_moves_forward(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path)
    d.claim((4, 2))
    with pytest.raises(StaleGeneration):
        d.claim((4, 1))
    assert d.fence() == (4, 2)
    assert json.loads(json.dumps(sorted(p.name for p in (tmp_path / "fence").iterdir()))) == [
        "gen-0000000004-000001", "gen-0000000004-000002"]


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from gpufleet.sandbox.training import checkpoint as c
d = c.CheckpointDir(Path(sys.argv[1]))
d.claim((6, 0))
d.write((6, 0), 10, b"complete" * 1000, {})
real = c.create_no_replace
def die_before_manifest(final, data):
    if final.name.endswith(".json") and not final.name.endswith(".meta.json"):
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 between the files and the manifest
    real(final, data)
c.create_no_replace = die_before_manifest
d.write((6, 0), 20, b"cut-off" * 1000, {})
"""


def test_a_save_cut_off_by_kill_9_is_skipped_as_incomplete(tmp_path: Path) -> None:
    """A real SIGKILL of a writing process: the files of step 20 are on disk, its manifest is not."""
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)]
    res = subprocess.run(argv, capture_output=True, timeout=60)
    assert res.returncode == -signal.SIGKILL, res.stderr.decode()
    assert (tmp_path / f"{K(6, 0, 20).stem}.pt").exists()
    loaded, skipped = CheckpointDir(tmp_path).newest_valid()
    assert loaded is not None and loaded.key == K(6, 0, 10) and loaded.payload == b"complete" * 1000
    assert skipped == [(K(6, 0, 20), "incomplete: no manifest (the save was cut off)")]
