"""Build a gpufleet.slo Timeline from recorded inputs (pure): ledger records, the alert's first
firing time, scheduler transitions and workload events. The I/O that gathers them lives in
workload/probes.py; everything here is tested on recorded inputs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.chaos.ledger import FaultRecord
from gpufleet.chaos.scheduler import Transition
from gpufleet.slo import Event, EventKind, Timeline


@dataclass(frozen=True)
class WorkloadFacts:
    interrupted_at: float | None  # last step before the stall / restart
    resumed_at: float | None  # first step after the restart (or after the stall)
    steps_at_fault: int | None
    checkpoint_step_at_fault: int | None
    resumed_from_step: int | None
    restarted: bool


def read_jsonl(path: str | Path, limit_bytes: int = 50_000_000) -> list[dict[str, Any]]:
    """Training events (JSONL: {"t", "event", "step", "restart", "job_id", "node"}); torn lines skipped."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit_bytes)
    except OSError:
        return []
    out = []
    for raw in data.splitlines():
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        if isinstance(ev, dict) and "t" in ev:
            out.append(ev)
    return out


def _steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "step" and e.get("step") is not None]


def _last_done_step(
    events: list[dict[str, Any]], restart0: int | None, before: float, fallback: int | None
) -> int | None:
    """Last step the interrupted incarnation completed: step events are sampled (about one a second)
    but a checkpoint proves its step was done, so the later of the two counts."""
    done = [
        int(e["step"])
        for e in events
        if e.get("event") in ("step", "checkpoint")
        and e.get("step") is not None
        and int(e.get("restart", 0)) == restart0
        and float(e["t"]) < before
    ]
    return max(done) if done else fallback


def workload_facts(events: list[dict[str, Any]], t0: float, stall_seconds: float) -> WorkloadFacts:
    """What the workload did around a fault at t0.

    Restart path: the first "resume" (or "start") event after t0 with a higher restart count marks a
    restart; interrupted = last step of the old incarnation, resumed = first step of the new one,
    resumed_from_step = the resume event's step. Without a restart, a gap between steps longer than
    `stall_seconds` after t0 is a stall (interrupted = step before it, resumed = step after it).
    """
    events = sorted(events, key=lambda e: float(e["t"]))
    steps = _steps(events)
    before = [e for e in steps if float(e["t"]) <= t0]
    steps_at_fault = int(before[-1]["step"]) if before else None
    restart0 = int(before[-1].get("restart", 0)) if before else None
    ckpts = [
        e
        for e in events
        if e.get("event") == "checkpoint" and float(e["t"]) <= t0 and e.get("step") is not None
    ]
    ckpt = int(ckpts[-1]["step"]) if ckpts else None
    restarts = [
        e
        for e in events
        if e.get("event") in ("resume", "start")
        and float(e["t"]) > t0
        and (restart0 is None or int(e.get("restart", 0)) > restart0)
    ]
    if restarts:
        first = restarts[0]
        old = [e for e in steps if int(e.get("restart", 0)) == restart0 and float(e["t"]) < float(first["t"])]
        # The first step of ANY later incarnation: a restart that fails again before its first step
        # (e.g. requeued onto the same faulty node) does not count as resumed.
        new = [
            e
            for e in steps
            if float(e["t"]) > t0 and (restart0 is None or int(e.get("restart", 0)) > restart0)
        ]
        resumed = new[0] if new else None
        rc = int(resumed.get("restart", 0)) if resumed else None
        # The "start" event carries no step; the "resume" event of the incarnation that made progress
        # names the checkpoint step it loaded (none: it started from scratch).
        resume = next(
            (
                e
                for e in events
                if e.get("event") == "resume" and rc is not None and int(e.get("restart", 0)) == rc
            ),
            None,
        )
        return WorkloadFacts(
            interrupted_at=float(old[-1]["t"]) if old else None,
            resumed_at=float(resumed["t"]) if resumed else None,
            steps_at_fault=_last_done_step(events, restart0, float(first["t"]), steps_at_fault),
            checkpoint_step_at_fault=ckpt,
            resumed_from_step=int(resume["step"]) if resume and resume.get("step") is not None else None,
            restarted=True,
        )
    prev = before[-1] if before else None
    for e in steps:
        if float(e["t"]) <= t0:
            continue
        if prev is not None and float(e["t"]) - float(prev["t"]) > stall_seconds:
            return WorkloadFacts(float(prev["t"]), float(e["t"]), steps_at_fault, ckpt, None, False)
        prev = e
    # No restart and no finished stall (one still running is found by stalled_now).
    return WorkloadFacts(None, None, steps_at_fault, ckpt, None, False)


def stalled_now(events: list[dict[str, Any]], now: float, stall_seconds: float) -> float | None:
    """Time of the last step when the workload has made none for `stall_seconds` (else None)."""
    steps = _steps(events)
    if steps and now - float(steps[-1]["t"]) > stall_seconds:
        return float(steps[-1]["t"])
    return None


def unavailable_intervals(
    baseline: dict[str, bool], transitions: Iterable[Transition], window: tuple[float, float]
) -> dict[str, list[tuple[float, float | None]]]:
    """Per node, the intervals it was not schedulable within the window (open at the end: None)."""
    out: dict[str, list[tuple[float, float | None]]] = {}
    open_since = {n: window[0] for n, ok in baseline.items() if not ok}
    for t in sorted(transitions, key=lambda x: x.at):
        if not t.schedulable and t.node not in open_since:
            open_since[t.node] = t.at
        elif t.schedulable and t.node in open_since:
            out.setdefault(t.node, []).append((open_since.pop(t.node), t.at))
    for n, s in open_since.items():
        out.setdefault(n, []).append((s, None))
    return out


def workload_noticed(events: list[dict[str, Any]], t0: float) -> tuple[float, str] | None:
    """The job's own detection of a crashed rank: the first `error` (a peer's collective failed)
    or `exit` (by a signal: srun --kill-on-bad-exit ended the step) event after t0. A killed process
    has no hardware signal for monitoring to see; the job failing fast is how it is detected."""
    for e in sorted(events, key=lambda e: float(e["t"])):
        if float(e["t"]) < t0 or e.get("event") not in ("error", "exit"):
            continue
        if e.get("event") == "exit" and e.get("reason") == "finished":
            continue
        what = str(e.get("message") or e.get("reason") or e.get("event"))[:120]
        return float(e["t"]), f"rank {e.get('rank')} on {e.get('node')}: {what}"
    return None


def build_timeline(
    experiment: str,
    fault_id: str,
    fault_class: str,
    records: list[FaultRecord],
    reverted_at: dict[str, float],
    window: tuple[float, float],
    alert_name: str | None,
    alert_first_firing: float | None,
    health_detected: tuple[float, str] | None,
    nodes: set[str],
    baseline: dict[str, bool],
    transitions: list[Transition],
    workload: WorkloadFacts | None,
    nodes_total: int | None,
    workload_detected: tuple[float, str] | None = None,
) -> Timeline:
    ev: list[Event] = []
    if workload_detected is not None:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=workload_detected[0],
                source="workload",
                detail=workload_detected[1],
            )
        )
    for r in records:
        node = r.target.get("node")
        ev.append(
            Event(
                kind=EventKind.INJECTED,
                at=r.at,
                source="ledger",
                node=node,
                detail=f"{r.kind} {r.target} (ledger {r.id})",
            )
        )
        if r.id in reverted_at:
            ev.append(
                Event(
                    kind=EventKind.REVERTED,
                    at=reverted_at[r.id],
                    source="ledger",
                    node=node,
                    detail=f"rollback {r.rollback.name}",
                )
            )
    if alert_first_firing is not None and alert_name:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=alert_first_firing,
                source=f"prometheus:{alert_name}",
                detail="first firing sample of ALERTS",
            )
        )
    if health_detected is not None:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=health_detected[0],
                source="health-check",
                detail=health_detected[1],
            )
        )
    t0 = min((r.at for r in records), default=window[0])
    for t in transitions:
        if t.node not in nodes or t.at < t0:
            continue
        if not t.schedulable:
            # Slurm's reason time (1 s resolution) is when the drain was set; the poll saw it later.
            at = t.reason_time if t.reason_time is not None and t0 <= t.reason_time <= t.at else t.at
            ev.append(
                Event(
                    kind=EventKind.ISOLATED,
                    at=at,
                    source=f"scheduler:{t.node}",
                    node=t.node,
                    detail=f"{t.state}: {t.reason}".strip(": "),
                )
            )
        else:
            ev.append(
                Event(
                    kind=EventKind.RETURNED,
                    at=t.at,
                    source=f"scheduler:{t.node}",
                    node=t.node,
                    detail=t.state,
                )
            )
    tl = Timeline(
        experiment=experiment,
        fault_id=fault_id,
        fault_class=fault_class,
        window_start=window[0],
        window_end=window[1],
        nodes_total=nodes_total,
        nodes_unavailable=unavailable_intervals(baseline, transitions, window),
    )
    if workload is not None:
        if workload.interrupted_at is not None:
            ev.append(
                Event(
                    kind=EventKind.INTERRUPTED,
                    at=max(workload.interrupted_at, t0),
                    source="workload",
                    detail=f"last step before the stall at {workload.interrupted_at:.3f}",
                )
            )
        if workload.resumed_at is not None:
            ev.append(
                Event(
                    kind=EventKind.RESUMED,
                    at=workload.resumed_at,
                    source="workload",
                    detail="first step after restart" if workload.restarted else "first step after stall",
                )
            )
        tl.steps_at_fault = workload.steps_at_fault
        tl.checkpoint_step_at_fault = workload.checkpoint_step_at_fault
        tl.resumed_from_step = workload.resumed_from_step
    tl.events = sorted(ev, key=lambda e: e.at)
    return tl
