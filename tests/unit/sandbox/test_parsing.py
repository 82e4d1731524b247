"""Parsing Slurm output and training events (gpufleet.sandbox.slurm, gpufleet.sandbox.workload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.core.slurm_state import NodeObs, parse_sinfo
from gpufleet.core.training_events import TrainingEvent
from gpufleet.sandbox import slurm, workload


def _ev(**fields: Any) -> TrainingEvent:
    return TrainingEvent(job_id=1, node="gpu-0", rank=0, **fields)


def test_parse_sinfo_states_flags_and_reasons() -> None:
    text = (
        "gpu-0|idle|none|Unknown\n"
        "gpu-1|drained|XID 79 on GPU 3 (gpu-xid-79)|2026-12-03T08:00:00\n"
        "gpu-2|down*|Not responding|Unknown\n"
        "gpu-3|mixed|none|Unknown\n"
        "gpu-4|idle*|none|Unknown\n"
    )
    st = parse_sinfo(text)  # one parser for the sandbox and the chaos backends
    assert st["gpu-0"] == NodeObs("gpu-0", "idle", "", None, True)
    assert st["gpu-1"].base_state == "drained" and st["gpu-1"].reason == "XID 79 on GPU 3 (gpu-xid-79)"
    assert st["gpu-2"].base_state == "down" and not st["gpu-2"].responding
    assert slurm.all_idle(st, ["gpu-0"])
    assert not slurm.all_idle(st, ["gpu-0", "gpu-4"])  # not responding is not idle
    assert not slurm.all_idle(st, ["gpu-0", "gpu-9"])  # unknown node


def test_parse_squeue() -> None:
    jobs = slurm.parse_squeue("7|train-abc123|RUNNING|gpu-[0-1]\n8|x|PENDING|\n")
    assert jobs[0] == slurm.JobState("7", "train-abc123", "RUNNING", "gpu-[0-1]")
    assert jobs[1].state == "PENDING"


def test_progress_from_events(tmp_path: Path) -> None:
    events = [
        _ev(event="start", step=None, restart=0, t=1.0),
        _ev(event="step", step=1, restart=0, t=2.0),
        _ev(event="step", step=17, restart=0, t=3.0),
        _ev(event="step", step=21, restart=1, t=9.0),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(e.line() for e in events) + '{"event": "st')  # torn last line
    p = workload.read_progress(path)
    assert (p.max_step, p.steps_seen, p.restarts, p.first_t, p.last_t) == (21, 3, 1, 2.0, 9.0)
    assert workload.progressing(p)


def test_not_progressing_before_two_steps(tmp_path: Path) -> None:
    assert not workload.progressing(workload.read_progress(tmp_path / "absent.jsonl"))
    one = workload.progress([_ev(event="step", step=1, restart=0, t=1.0)])
    assert not workload.progressing(one)
