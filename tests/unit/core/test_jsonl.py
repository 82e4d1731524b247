"""The one reader of appended JSON lines files (gpufleet.core.jsonl)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.core.jsonl import json_lines, read_objects


def test_torn_and_blank_lines_are_skipped_with_line_numbers_kept() -> None:
    lines = [b'{"a": 1}', b"", b'{"b": 2', b"[3]", b'{"c": 4}']
    assert list(json_lines(lines)) == [(1, {"a": 1}), (4, [3]), (5, {"c": 4})]


def test_objects_of_a_file_stop_at_the_read_limit(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    assert read_objects(path) == []  # not written yet
    path.write_text('{"t": 1}\n[1, 2]\n{"t": 2}\n{"t": 3, "cut')
    assert read_objects(path) == [{"t": 1}, {"t": 2}]
    assert read_objects(path, limit_bytes=9) == [{"t": 1}]
