"""Build a gpufleet.slo Timeline from recorded inputs (pure): ledger records, the alert's first
firing time, scheduler transitions and workload events. The I/O that gathers them lives in
workload/probes.py; everything here is tested on recorded inputs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.chaos.backends.base import TrainingPods
from gpufleet.chaos.ledger import FaultRecord
from gpufleet.chaos.scheduler import Transition
from gpufleet.core.slurm_state import NodeObs
from gpufleet.core.training_events import TrainingEvent
from gpufleet.slo import Event, EventKind, Timeline


@dataclass(frozen=True)
class WorkloadFacts:
    interrupted_at: float | None  # last step before the stall / restart
    resumed_at: float | None  # first step after the restart (or after the stall)
    steps_at_fault: int | None
    checkpoint_step_at_fault: int | None
    resumed_from_step: int | None
    restarted: bool


def _steps(events: list[TrainingEvent]) -> list[TrainingEvent]:
    return [e for e in events if e.event == "step" and e.step is not None]


def _last_done_step(
    events: list[TrainingEvent], restart0: int | None, before: float, fallback: int | None
) -> int | None:
    """Last step the interrupted incarnation completed: step events are sampled (about one a second)
    but a checkpoint proves its step was done, so the later of the two counts."""
    done = [
        e.step
        for e in events
        if e.event in ("step", "checkpoint") and e.step is not None and e.restart == restart0 and e.t < before
    ]
    return max(done) if done else fallback


def workload_facts(events: list[TrainingEvent], t0: float, stall_seconds: float) -> WorkloadFacts:
    """What the workload did around a fault at t0.

    Restart path: the first "resume" (or "start") event after t0 with a higher restart count marks a
    restart; interrupted = last step of the old incarnation, resumed = first step of the new one,
    resumed_from_step = the resume event's step. Without a restart, a gap between steps longer than
    `stall_seconds` after t0 is a stall (interrupted = step before it, resumed = step after it).
    """
    events = sorted(events, key=lambda e: e.t)
    steps = _steps(events)
    before = [e for e in steps if e.t <= t0]
    steps_at_fault = before[-1].step if before else None
    restart0 = before[-1].restart if before else None
    ckpts = [e for e in events if e.event == "checkpoint" and e.t <= t0 and e.step is not None]
    ckpt = ckpts[-1].step if ckpts else None
    restarts = [
        e
        for e in events
        if e.event in ("resume", "start") and e.t > t0 and (restart0 is None or e.restart > restart0)
    ]
    if restarts:
        first = restarts[0]
        old = [e for e in steps if e.restart == restart0 and e.t < first.t]
        # The first step of ANY later incarnation: a restart that fails again before its first step
        # (e.g. requeued onto the same faulty node) does not count as resumed.
        new = [e for e in steps if e.t > t0 and (restart0 is None or e.restart > restart0)]
        resumed = new[0] if new else None
        # The "start" event carries no step; the "resume" event of the incarnation that made progress
        # names the checkpoint step it loaded (none: it started from scratch).
        rc = resumed.restart if resumed is not None else None
        resume = next((e for e in events if e.event == "resume" and e.restart == rc), None)
        return WorkloadFacts(
            interrupted_at=old[-1].t if old else None,
            resumed_at=resumed.t if resumed else None,
            steps_at_fault=_last_done_step(events, restart0, first.t, steps_at_fault),
            checkpoint_step_at_fault=ckpt,
            resumed_from_step=resume.step if resume else None,
            restarted=True,
        )
    prev = before[-1] if before else None
    for e in steps:
        if e.t <= t0:
            continue
        if prev is not None and e.t - prev.t > stall_seconds:
            return WorkloadFacts(prev.t, e.t, steps_at_fault, ckpt, None, False)
        prev = e
    # No restart and no finished stall (one still running is found by stalled_now).
    return WorkloadFacts(None, None, steps_at_fault, ckpt, None, False)


def stalled_now(events: list[TrainingEvent], now: float, stall_seconds: float) -> float | None:
    """Time of the last step when the workload has made none for `stall_seconds` (else None)."""
    steps = _steps(events)
    if steps and now - steps[-1].t > stall_seconds:
        return steps[-1].t
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


def workload_noticed(events: list[TrainingEvent], t0: float) -> tuple[float, str] | None:
    """The job's own detection of a crashed rank: the first `error` (a peer's collective failed)
    or `exit` (by a signal: srun --kill-on-bad-exit ended the step) event after t0. A killed process
    has no hardware signal for monitoring to see; the job failing fast is how it is detected."""
    for e in sorted(events, key=lambda e: e.t):
        if e.t < t0 or e.event not in ("error", "exit"):
            continue
        if e.event == "exit" and e.reason == "finished":
            continue
        what = str(e.message or e.reason or e.event)[:120]
        return e.t, f"rank {e.rank} on {e.node}: {what}"
    return None


def first_problem(
    samples: list[tuple[float, dict[str, NodeObs]]], nodes: set[str], t0: float
) -> tuple[float, str] | None:
    """When a faulted node first reported a problem of its own (Kubernetes: the node-health
    condition True or the node not Ready) at or after t0: the reporting condition's transition time
    when it lies between t0 and the sample that saw it (it has a 1 s resolution), else the sample's."""
    for at, obs in samples:
        if at < t0:
            continue
        for name in sorted(nodes):
            o = obs.get(name)
            if o is None or not o.problem:
                continue
            since = o.problem_since
            when = since if since is not None and t0 <= since <= at else at
            return when, f"{name}: {o.reason or o.state}"
    return None


@dataclass(frozen=True)
class PodFacts:
    """What the training job's pods did around a fault (a backend whose workload is pods)."""

    interrupted: tuple[float, TrainingPods] | None  # first sample with fewer Running than wanted
    resumed: tuple[float, TrainingPods] | None  # first later sample with all of them Running again


def pod_facts(samples: list[tuple[float, TrainingPods]], t0: float) -> PodFacts:
    """Interrupted = the first sample at or after t0 with fewer Running pods than the job needs;
    resumed = the first sample after that with all of them Running again (pure)."""
    interrupted = next(((t, p) for t, p in sorted(samples, key=lambda x: x[0]) if t >= t0 and not p.complete),
                       None)
    if interrupted is None:
        return PodFacts(None, None)
    resumed = next(((t, p) for t, p in sorted(samples, key=lambda x: x[0])
                    if t > interrupted[0] and p.complete), None)
    return PodFacts(interrupted, resumed)


@dataclass(frozen=True)
class TimelineInputs:
    """Everything one recovery timeline is built from, gathered by the probe (I/O) and read by
    build_timeline (pure)."""

    experiment: str
    fault_id: str
    fault_class: str
    records: list[FaultRecord]  # this run's faults, from the ledger
    reverted_at: dict[str, float]  # ledger id -> when its rollback ran
    window: tuple[float, float]
    alert_name: str | None
    alert_first_firing: float | None
    health_detected: tuple[float, str] | None  # the scheduler noticing a target node
    nodes: set[str]  # the faulted nodes
    baseline: dict[str, bool]  # schedulable per node before the first fault
    transitions: list[Transition]
    workload: WorkloadFacts | None
    nodes_total: int | None
    workload_detected: tuple[float, str] | None = None  # the job failing fast (a killed rank)
    # The training job's pods, sampled (a backend whose workload is pods: Kubernetes), instead of
    # the training events; interrupted and resumed come from them.
    pods: list[tuple[float, TrainingPods]] | None = None


def build_timeline(i: TimelineInputs) -> Timeline:
    ev: list[Event] = []
    if i.workload_detected is not None:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=i.workload_detected[0],
                source="workload",
                detail=i.workload_detected[1],
            )
        )
    for r in i.records:
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
        if r.id in i.reverted_at:
            ev.append(
                Event(
                    kind=EventKind.REVERTED,
                    at=i.reverted_at[r.id],
                    source="ledger",
                    node=node,
                    detail=f"rollback {r.rollback.name}",
                )
            )
    if i.alert_first_firing is not None and i.alert_name:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=i.alert_first_firing,
                source=f"prometheus:{i.alert_name}",
                detail="first firing sample of ALERTS",
            )
        )
    if i.health_detected is not None:
        ev.append(
            Event(
                kind=EventKind.DETECTED,
                at=i.health_detected[0],
                source="health-check",
                detail=i.health_detected[1],
            )
        )
    t0 = min((r.at for r in i.records), default=i.window[0])
    for t in i.transitions:
        if t.node not in i.nodes or t.at < t0:
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
        experiment=i.experiment,
        fault_id=i.fault_id,
        fault_class=i.fault_class,
        window_start=i.window[0],
        window_end=i.window[1],
        nodes_total=i.nodes_total,
        nodes_unavailable=unavailable_intervals(i.baseline, i.transitions, i.window),
    )
    if i.workload is not None:
        if i.workload.interrupted_at is not None:
            ev.append(
                Event(
                    kind=EventKind.INTERRUPTED,
                    at=max(i.workload.interrupted_at, t0),
                    source="workload",
                    detail=f"last step before the stall at {i.workload.interrupted_at:.3f}",
                )
            )
        if i.workload.resumed_at is not None:
            ev.append(
                Event(
                    kind=EventKind.RESUMED,
                    at=i.workload.resumed_at,
                    source="workload",
                    detail="first step after restart" if i.workload.restarted else "first step after stall",
                )
            )
        tl.steps_at_fault = i.workload.steps_at_fault
        tl.checkpoint_step_at_fault = i.workload.checkpoint_step_at_fault
        tl.resumed_from_step = i.workload.resumed_from_step
    elif i.pods is not None:
        pf = pod_facts(i.pods, t0)
        if pf.interrupted is not None:
            at, p = pf.interrupted
            ev.append(
                Event(
                    kind=EventKind.INTERRUPTED,
                    at=at,
                    source=f"pods:{p.job}",
                    detail=f"{p.running} of {p.wanted} pods Running ({p.pending} pending)",
                )
            )
        if pf.resumed is not None:
            at, p = pf.resumed
            ev.append(
                Event(
                    kind=EventKind.RESUMED,
                    at=at,
                    source=f"pods:{p.job}",
                    detail=f"all {p.wanted} pods Running again, on {', '.join(p.nodes)}",
                )
            )
    tl.events = sorted(ev, key=lambda e: e.at)
    return tl
