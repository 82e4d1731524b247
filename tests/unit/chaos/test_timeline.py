"""Timeline building from recorded inputs, and its measurement by gpufleet.slo."""

from typing import Any

from gpufleet.chaos.backends.base import TrainingPods
from gpufleet.chaos.ledger import FaultRecord, Rollback
from gpufleet.chaos.scheduler import transitions
from gpufleet.chaos.timeline import (
    TimelineInputs,
    build_timeline,
    first_problem,
    pod_facts,
    unavailable_intervals,
    workload_facts,
)
from gpufleet.core.slurm_state import NodeObs, parse_sinfo, schedulable
from gpufleet.core.training_events import TrainingEvent
from gpufleet.slo import Budget, EventKind, judge, measure

T0 = 1000.0


def E(**fields: Any) -> TrainingEvent:
    return TrainingEvent(**{"restart": 0, "job_id": 1, "node": "gpu-0", "rank": 0, **fields})


def _events() -> list[TrainingEvent]:
    ev: list[TrainingEvent] = [E(t=T0 - 30, event="start", step=None, restart=0)]
    ev += [E(t=T0 - 20 + i, event="step", step=100 + 10 * i, restart=0) for i in range(21)]
    ev += [E(t=T0 - 5, event="checkpoint", step=240, restart=0)]
    # fault at T0; old incarnation's last step at T0 + 0; restart 1 starts at T0 + 25
    ev += [
        E(t=T0 + 25, event="start", step=None, restart=1),
        E(t=T0 + 27, event="resume", step=240, restart=1),
        E(t=T0 + 28.5, event="step", step=241, restart=1),
        E(t=T0 + 30, event="step", step=250, restart=1),
    ]
    return ev


def test_workload_facts_after_a_restart() -> None:
    f = workload_facts(_events(), T0, stall_seconds=3)
    assert f.restarted
    assert f.interrupted_at == T0  # last step of restart 0
    assert f.resumed_at == T0 + 28.5  # first step of restart 1
    assert f.steps_at_fault == 300
    assert f.checkpoint_step_at_fault == 240
    assert f.resumed_from_step == 240


def test_workload_facts_stall_without_restart() -> None:
    ev = [E(t=T0 - 1 + i, event="step", step=i, restart=0) for i in range(3)]
    ev += [E(t=T0 + 12, event="step", step=3, restart=0)]
    f = workload_facts(ev, T0, stall_seconds=3)
    assert (f.interrupted_at, f.resumed_at, f.restarted) == (T0 + 1, T0 + 12, False)


def test_workload_not_interrupted() -> None:
    ev = [E(t=T0 - 5 + i, event="step", step=i, restart=0) for i in range(20)]
    f = workload_facts(ev, T0, stall_seconds=3)
    assert f.interrupted_at is None and f.resumed_at is None and f.steps_at_fault == 5


def test_sinfo_parsing_and_states() -> None:
    text = (
        "gpu-0|idle|none|Unknown\n"
        "gpu-1|drained|xid 79 on gpu 0|2026-01-01T00:00:05\n"
        "gpu-2|down*|Not responding|2026-01-01T00:00:09\n"
        "gpu-3|mixed|none|Unknown\n"
    )
    nodes = parse_sinfo(text)
    assert {n: o.schedulable for n, o in nodes.items()} == {
        "gpu-0": True,
        "gpu-1": False,
        "gpu-2": False,
        "gpu-3": True,
    }
    assert nodes["gpu-1"].reason == "xid 79 on gpu 0" and nodes["gpu-0"].reason == ""
    assert nodes["gpu-1"].reason_time is not None
    assert not schedulable("idle*") and not schedulable("draining") and schedulable("allocated")


def _obs(name: str, ok: bool, reason: str = "", rt: float | None = None) -> NodeObs:
    return NodeObs(name, "idle" if ok else "drained", reason, rt, ok)


def test_timeline_end_to_end_from_recorded_inputs() -> None:
    samples = [
        (T0 - 1, {"gpu-0": _obs("gpu-0", True), "gpu-1": _obs("gpu-1", True)}),
        (
            T0 + 6,
            {"gpu-0": _obs("gpu-0", False, "GpuFallenOffBus xid 79", T0 + 5), "gpu-1": _obs("gpu-1", True)},
        ),
        (T0 + 50, {"gpu-0": _obs("gpu-0", True), "gpu-1": _obs("gpu-1", True)}),
    ]
    trans = transitions(samples)
    assert [(t.node, t.schedulable) for t in trans] == [("gpu-0", False), ("gpu-0", True)]
    rec = FaultRecord(
        kind="dcgm-inject",
        backend="sandbox",
        target={"node": "gpu-0", "gpu": 0},
        rollback=Rollback("sandbox.agent-clear"),
        fault_id="gpu-xid-79",
        at=T0,
    )
    tl = build_timeline(
        TimelineInputs(
            experiment="xid79",
            fault_id="gpu-xid-79",
            fault_class="gpu-fatal",
            records=[rec],
            reverted_at={rec.id: T0 + 45},
            window=(T0 - 1, T0 + 60),
            alert_name="GpuFallenOffBus",
            alert_first_firing=T0 + 3.0,
            health_detected=None,
            nodes={"gpu-0"},
            baseline={"gpu-0": True, "gpu-1": True},
            transitions=trans,
            workload=workload_facts(_events(), T0, 3),
            nodes_total=5,
        )
    )
    kinds = [(e.kind, e.at) for e in tl.events]
    assert (EventKind.INJECTED, T0) in kinds
    assert (EventKind.DETECTED, T0 + 3.0) in kinds
    assert (EventKind.ISOLATED, T0 + 5) in kinds  # Slurm's reason time, not the later poll
    assert (EventKind.RESUMED, T0 + 28.5) in kinds
    assert (EventKind.REVERTED, T0 + 45) in kinds
    assert (EventKind.RETURNED, T0 + 50) in kinds
    assert tl.nodes_unavailable == {"gpu-0": [(T0 + 5, T0 + 50)]} or tl.nodes_unavailable == {
        "gpu-0": [(T0 + 6, T0 + 50)]
    }
    m = measure(tl)
    assert m.time_to_detect == 3.0 and m.time_to_isolate == 5.0 and m.time_to_recover == 28.5
    assert m.lost_steps == 60  # 300 at the fault, resumed from 240
    assert judge(m, Budget(15, 15, 60)).outcome.value == "PASS"
    assert judge(m, Budget(1, 1, 1)).outcome.value == "FAIL"


def test_unavailable_intervals_open_at_the_end() -> None:
    samples = [(0.0, {"a": _obs("a", True)}), (5.0, {"a": _obs("a", False)})]
    assert unavailable_intervals({"a": True}, transitions(samples), (0, 10)) == {"a": [(5.0, None)]}


def test_a_restart_that_fails_before_its_first_step_is_not_a_resume() -> None:
    ev: list[TrainingEvent] = [
        E(t=T0 - 1, event="step", step=50, restart=0),
        E(t=T0 - 0.5, event="checkpoint", step=52, restart=0),
    ]
    ev += [
        E(t=T0 + 20, event="start", step=None, restart=1),
        E(t=T0 + 40, event="resume", step=52, restart=1),
        E(t=T0 + 41, event="error", step=52, restart=1),  # requeued onto the faulty node
        E(t=T0 + 70, event="start", step=None, restart=2),
        E(t=T0 + 90, event="resume", step=52, restart=2),
        E(t=T0 + 91, event="step", step=53, restart=2),
    ]
    f = workload_facts(ev, T0, stall_seconds=3)
    assert f.resumed_at == T0 + 91 and f.resumed_from_step == 52
    assert f.steps_at_fault == 52  # the checkpoint proves step 52 was done; the last step event said 50
    assert workload_facts(ev[:5], T0, 3).resumed_at is None


def test_a_killed_rank_is_detected_by_the_job_failing() -> None:
    from gpufleet.chaos.timeline import workload_noticed

    events = [
        E(t=99.0, event="exit", reason="finished", rank=1, node="gpu-1"),
        E(t=100.5, event="step", step=10, restart=0),
        E(t=101.2, event="error", rank=1, node="gpu-1",
         message="RuntimeError: Connection closed"),
        E(t=101.4, event="exit", rank=1, node="gpu-1", reason="signal SIGTERM"),
    ]
    assert workload_noticed(events, 100.0) == (101.2, "rank 1 on gpu-1: RuntimeError: Connection closed")
    assert workload_noticed(events[:2], 100.0) is None  # a finished job detects nothing
    assert workload_noticed(events, 102.0) is None


# ----------------------------------------------------------------------------- Kubernetes: pods, node reports


def pods(running: int, nodes: tuple[str, ...] = ("gpu-0", "gpu-1"), pending: int = 0) -> TrainingPods:
    return TrainingPods("default/train", 2, running, pending, nodes[:running])


def test_pod_facts_interrupted_and_resumed() -> None:
    samples = [(T0 - 1, pods(2)), (T0 + 0.4, pods(2)), (T0 + 0.9, pods(1)), (T0 + 5, pods(1, pending=1)),
               (T0 + 11.2, pods(2, ("gpu-2", "gpu-1"))), (T0 + 12, pods(2))]
    f = pod_facts(samples, T0)
    assert f.interrupted is not None and f.interrupted[0] == T0 + 0.9
    assert f.resumed is not None and f.resumed[0] == T0 + 11.2
    assert pod_facts([(T0 - 1, pods(1)), (T0 + 1, pods(2))], T0).interrupted is None  # before the fault
    never = pod_facts([(T0 + 1, pods(1)), (T0 + 2, pods(1))], T0)
    assert never.interrupted is not None and never.resumed is None


def sim(name: str, ok: bool = True, problem: bool = False, since: float | None = None) -> NodeObs:
    reason = "GpuFleetProblem: XID 79" if problem else ""
    return NodeObs(name, "schedulable" if ok else "cordoned+tainted", reason, None, ok, problem=problem,
                   problem_since=since)


def test_first_problem_takes_the_conditions_time_when_it_is_inside_the_window() -> None:
    samples = [(T0 - 1, {"a": sim("a")}), (T0 + 0.6, {"a": sim("a", problem=True, since=T0)}),
               (T0 + 1.1, {"a": sim("a", ok=False, problem=True, since=T0)})]
    assert first_problem(samples, {"a"}, T0) == (T0, "a: GpuFleetProblem: XID 79")
    truncated = [(T0 + 0.6, {"a": sim("a", problem=True, since=T0 - 0.7)})]  # RFC 3339 seconds
    assert first_problem(truncated, {"a"}, T0) == (T0 + 0.6, "a: GpuFleetProblem: XID 79")
    assert first_problem(samples, {"b"}, T0) is None


def test_timeline_from_pods_and_the_scheduler() -> None:
    """A Kubernetes run: detected by the node's condition, isolated by the quarantine, interrupted and
    resumed by the training Job's pods; judged by the same measurement."""
    snap = [(T0 - 1, {"a": sim("a"), "b": sim("b")}), (T0 + 0.6, {"a": sim("a", problem=True, since=T0),
                                                                   "b": sim("b")}),
            (T0 + 1.5, {"a": sim("a", ok=False, problem=True, since=T0), "b": sim("b")}),
            (T0 + 40, {"a": sim("a"), "b": sim("b")})]
    rec = FaultRecord(kind="dcgm-inject", backend="kubernetes", target={"node": "a", "gpu": 0},
                      rollback=Rollback("kubernetes.node-condition"), fault_id="gpu-xid-79", at=T0)
    tl = build_timeline(TimelineInputs(
        experiment="k8s", fault_id="gpu-xid-79", fault_class="gpu-fatal", records=[rec], reverted_at={},
        window=(T0 - 1, T0 + 41), alert_name=None, alert_first_firing=None,
        health_detected=first_problem(snap, {"a"}, T0), nodes={"a"}, baseline={"a": True, "b": True},
        transitions=transitions(snap), workload=None, nodes_total=3,
        pods=[(T0 - 1, pods(2)), (T0 + 1.5, pods(1)), (T0 + 12.5, pods(2, ("b", "c")))],
    ))
    interrupted = next(e for e in tl.events if e.kind is EventKind.INTERRUPTED)
    assert interrupted.source == "pods:default/train"
    assert interrupted.detail == "1 of 2 pods Running (0 pending)"
    resumed = next(e for e in tl.events if e.kind is EventKind.RESUMED)
    assert resumed.detail == "all 2 pods Running again, on b, c"
    m = measure(tl)
    assert (m.time_to_detect, m.time_to_isolate, m.time_to_recover) == (0.0, 1.5, 12.5)
    assert judge(m, Budget(15, 15, 60)).outcome.value == "PASS"
