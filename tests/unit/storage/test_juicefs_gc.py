"""`juicefs gc` after a metadata restore: its summary line read, its command line, the window of
objects it must leave alone, and what the restore records (count, delete, count again)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos.backends import storage_undo
from gpufleet.chaos.storage.probes import _gc_note
from gpufleet.core import juicefs as jfs
from gpufleet.core.storage_contract import JuiceFsRecord

# The summary line as juicefs 1.4.2 logs it (cmd/gc.go), in its log format.
LOG = (
    "2026/12/05 05:30:01.123456 juicefs[4242] <INFO>: Data use s3://jfs-data/jfs/ [gc.go:101]\n"
    "2026/12/05 05:30:01.523456 juicefs[4242] <INFO>: scanned 57 objects, 49 valid, 8 leaked "
    "(6291456 bytes), 3 skipped (3145728 bytes) [gc.go:400]\n"
    "2026/12/05 05:30:01.523500 juicefs[4242] <INFO>: Please add `--delete` to clean leaked objects "
    "[gc.go:402]\n"
)


def test_the_summary_line_is_read() -> None:
    assert jfs.parse_gc(LOG) == jfs.GcCounts(scanned=57, valid=49, leaked=8, leaked_bytes=6291456, skipped=3)


def test_no_summary_line_is_an_error_not_zero_leaks() -> None:
    with pytest.raises(jfs.JuiceFsError, match="no summary line"):
        jfs.parse_gc("<FATAL>: list all blocks: connection refused")


def test_only_delete_deletes() -> None:
    assert "--delete" not in jfs.gc_argv("redis://127.0.0.1:1/1", delete=False)
    assert jfs.gc_argv("redis://127.0.0.1:1/1", delete=True)[-1] == "--delete"
    with pytest.raises(ValueError):
        jfs.gc("redis://127.0.0.1:1/1", delete=False, skip_newer_than_s=-1)


def _rec(tmp_path: Path) -> JuiceFsRecord:
    return JuiceFsRecord(
        name="jfs",
        meta_url="redis://127.0.0.1:1/1",
        meta_port=1,
        meta_db=1,
        meta_dir=str(tmp_path / "r"),
        scratch_port=2,
        bucket="jfs-data",
        mountpoint=str(tmp_path / "mnt"),
        cache_dir=str(tmp_path / "c"),
        cache_mib=64,
        metrics="127.0.0.1:3",
    )


def test_the_restore_counts_deletes_and_counts_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bool, int]] = []
    answers = iter(
        [
            jfs.GcCounts(40, 30, 10, 4096, 2),  # count
            jfs.GcCounts(40, 30, 10, 4096, 2),  # --delete: the 10 it deletes
            jfs.GcCounts(30, 30, 0, 0, 2),  # count again
        ]
    )

    def fake_gc(meta_url: str, delete: bool, skip_newer_than_s: int, timeout_s: float) -> jfs.GcCounts:
        calls.append((delete, skip_newer_than_s))
        return next(answers)

    monkeypatch.setattr(storage_undo.jfs, "gc", fake_gc)
    started = time.time() - 7.2
    doc = storage_undo._collect_leaks(_rec(tmp_path), started)
    assert [d for d, _ in calls] == [False, True, False]
    # Everything the restored mount may have written (since the restore started) is left alone.
    assert all(skip >= 8 for _, skip in calls), calls
    assert doc["leaked_found"] == 10 and doc["deleted"] == 10 and doc["leaked_after"] == 0
    assert "10 leaked object(s) (4096 bytes) found, 10 deleted, 0 left" in _gc_note(doc)


def test_a_failing_gc_is_recorded_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: Any, **k: Any) -> jfs.GcCounts:
        raise jfs.JuiceFsError("juicefs gc failed (exit 1): no such bucket")

    monkeypatch.setattr(storage_undo.jfs, "gc", broken)
    doc = storage_undo._collect_leaks(_rec(tmp_path), time.time())
    assert "no such bucket" in doc["error"]
    assert "failed" in _gc_note(doc) and _gc_note(None).endswith("not run")
