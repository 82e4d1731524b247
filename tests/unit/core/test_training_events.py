"""The training events file: one model for the ranks that write it and every reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.training_events import TrainingEvent, parse_events, read_events
from gpufleet.sandbox.training.progress import EventContext, EventLog


def test_what_a_rank_writes_every_reader_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, EventContext(job_id=7, restart=2, node="gpu-1", rank=0))
    log.emit("start", None, world_size=2, host="gpu-1", pid=123)
    log.step(5, force=True, loss=0.25)
    log.emit("checkpoint", 5, checkpoint="ckpt-x", bytes=10, write_seconds=0.01)
    events = read_events(path)
    assert [e.event for e in events] == ["start", "step", "checkpoint"]
    assert events[1] == TrainingEvent(t=events[1].t, event="step", step=5, restart=2, job_id=7, node="gpu-1",
                                      rank=0, loss=0.25)
    assert events[0].world_size == 2 and events[2].checkpoint == "ckpt-x"


def test_a_writer_cannot_invent_an_event_or_a_detail(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "e.jsonl", EventContext(1, 0, "n", 0))
    with pytest.raises(ValueError, match="event"):
        log.emit("exploded", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="colour"):
        log.emit("step", 1, colour="red")


def test_a_torn_last_line_is_skipped_and_a_foreign_line_is_an_error() -> None:
    good = '{"event": "step", "job_id": 1, "node": "n", "rank": 0, "restart": 0, "step": 3, "t": 1.0}'
    assert [e.step for e in parse_events([good, good[:30]])] == [3]  # being appended right now
    with pytest.raises(ValueError, match=r"f\.jsonl: line 2: .*restart"):
        parse_events([good, '{"t": 2.0, "event": "step"}'], "f.jsonl")


def test_a_missing_file_has_no_events(tmp_path: Path) -> None:
    assert read_events(tmp_path / "none.jsonl") == []
