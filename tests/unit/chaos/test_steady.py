"""The steady-state check (pure) and the healing loop against a stand-in backend."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.chaos import steady
from gpufleet.chaos.backends.base import Backend, TrainingPods
from gpufleet.chaos.ledger import FaultRecord, Ledger, Rollback
from gpufleet.core.slurm_state import NodeObs
from gpufleet.core.training_events import TrainingEvent


def node(name: str, state: str = "idle", reason: str = "") -> NodeObs:
    return NodeObs(name, state, reason, None, state in ("idle", "allocated", "mixed"))


def obs(**kw: object) -> steady.Observation:
    base: dict[str, object] = dict(
        dead_daemons=(), nodes={"gpu-0": node("gpu-0", "allocated"), "gpu-1": node("gpu-1")},
        pending_faults=(), critical_alerts=(), job_nodes=("gpu-0",), last_step_age_s=0.4,
        steps_this_incarnation=30,
    )
    base.update(kw)
    return steady.Observation(**base)  # type: ignore[arg-type]


def test_steady_state_holds() -> None:
    assert steady.problems(obs()) == []
    plan = steady.heal_plan(obs())
    assert plan == steady.HealPlan(False, False, (), False)


def test_each_precondition_is_named() -> None:
    found = steady.problems(obs(
        dead_daemons=("slurmd@gpu-1",), nodes={"gpu-1": node("gpu-1", "drained", "XID 79")},
        pending_faults=("node-crash {'node': 'gpu-0'} (run ab)",),
        critical_alerts=("GpuFallenOffBus{gpu-1}",),
        job_nodes=(), training_note="auto-resume gave up: restart budget spent",
    ))
    assert found == [
        "daemon slurmd@gpu-1 is not running",
        "node gpu-1 is not schedulable (drained: XID 79)",
        "fault still pending in the ledger: node-crash {'node': 'gpu-0'} (run ab)",
        "critical alert firing: GpuFallenOffBus{gpu-1}",
        "the training job runs on no node (auto-resume gave up: restart budget spent)",
    ]
    plan = steady.heal_plan(obs(dead_daemons=("x",), nodes={"gpu-1": node("gpu-1", "down*")},
                                pending_faults=("p",), job_nodes=()))
    assert plan == steady.HealPlan(True, True, ("gpu-1",), True)


def test_the_alert_that_must_detect_the_coming_fault_must_be_quiet() -> None:
    # FabricSymbolErrors counts errors over 10 minutes: still firing from an earlier run's fault, it
    # could not detect the next one. Waiting is the only remedy (nothing to heal).
    found = steady.problems(obs(busy_alerts=("FabricSymbolErrors{gpu-0}",)))
    assert found == ["alert FabricSymbolErrors{gpu-0} already firing: it must detect the coming experiment's "
                     "fault"]
    assert steady.heal_plan(obs(busy_alerts=("FabricSymbolErrors{gpu-0}",))) == steady.HealPlan(
        False, False, (), False)


def test_training_must_be_making_progress() -> None:
    stalled = "training is not making progress"
    assert steady.problems(obs(last_step_age_s=30.0)) == [f"{stalled} (last step 30 s ago)"]
    assert steady.problems(obs(last_step_age_s=None)) == [f"{stalled} (no step yet)"]
    only_one = "training has made only 1 step(s) since it started"
    assert steady.problems(obs(steps_this_incarnation=1)) == [only_one]
    # A backend that names no training job is not judged on one.
    assert steady.problems(obs(job_nodes=(), workload_known=False)) == []
    assert steady.problems(obs(unknown=("alerts (timeout)",))) == ["could not observe alerts (timeout)"]


def test_only_the_running_incarnation_counts_as_progress() -> None:
    def step(step: int, restart: int, t: float) -> TrainingEvent:
        return TrainingEvent(event="step", step=step, restart=restart, t=t, job_id=restart + 1, node="gpu-0",
                             rank=0)

    old = [step(s, 0, 100.0 + s) for s in range(1, 6)]  # incarnation 0 stepped until t=105
    # At t=107 the platform runs incarnation 1, resubmitted a moment ago: no step of it yet, however
    # recently incarnation 0 stepped (the old reading said "last step 2 s ago, 5 steps": steady).
    assert steady.training_progress(old, 1, 107.0) == (None, 0)
    assert steady.training_progress(old, 0, 107.0) == (2.0, 5)
    # A backend that does not say which incarnation runs: the newest in the events.
    started = [*old, TrainingEvent(event="start", restart=1, t=106.0, job_id=2, node="gpu-0", rank=0)]
    assert steady.training_progress(started, None, 107.0) == (None, 0)
    assert steady.training_progress([*started, step(5, 1, 108.0), step(6, 1, 109.0)], None, 110.0) == (1.0, 2)
    assert steady.training_progress([], None, 1.0) == (None, 0)


class FakeBackend(Backend):
    """A cluster whose job was killed: healing asks for a new job, which starts stepping."""

    name = "fake"

    def __init__(self, events: Path, world: dict[str, object]) -> None:
        self.events, self.world = events, world

    def node_states(self) -> dict[str, NodeObs]:
        return {n: node(n, str(s)) for n, s in dict(self.world["nodes"]).items()}  # type: ignore[call-overload]

    def job_nodes(self) -> list[str]:
        return ["gpu-0"] if self.world["job"] else []

    def workload_events(self) -> str | None:
        return str(self.events)

    def resume_node(self, node: str) -> None:
        self.world.setdefault("resumed", []).append(node)  # type: ignore[attr-defined]
        self.world["nodes"][node] = "idle"  # type: ignore[index]

    def resume_training(self) -> str:
        self.world["job"] = True
        now = time.time()
        self.events.write_text("".join(
            TrainingEvent(event="step", step=s, restart=1, t=now, job_id=2, node="gpu-0", rank=0).line()
            for s in (1, 2, 3)
        ))
        return "asked for a job"


def test_ensure_heals_reverts_resumes_and_waits(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.record(FaultRecord(kind="noop-fault", backend="fake", target={"node": "gpu-1"},
                              rollback=Rollback("noop", {})))
    world: dict[str, object] = {"nodes": {"gpu-0": "idle", "gpu-1": "drained"}, "job": False}
    backend = FakeBackend(tmp_path / "events.jsonl", world)
    ticks = iter(range(1000))
    report = steady.ensure(lambda: backend, ledger, timeout_s=50, clock=lambda: float(next(ticks)),
                           sleep=lambda _s: None)
    assert report.ok and report.remaining == []
    assert "node gpu-1 is not schedulable (drained)" in report.problems
    assert any(p.startswith("fault still pending in the ledger: noop-fault") for p in report.problems)
    assert report.actions == ["reverted 1 pending fault(s)", "resumed gpu-1", "asked for a job"]
    assert ledger.pending() == [] and world["resumed"] == ["gpu-1"]


def test_ensure_gives_up_with_what_remains(tmp_path: Path) -> None:
    world: dict[str, object] = {"nodes": {"gpu-0": "idle"}, "job": False}

    class NoJob(FakeBackend):
        def resume_training(self) -> str:
            return "asked for a job"  # ... which never comes

    ticks = iter(range(1000))
    report = steady.ensure(lambda: NoJob(tmp_path / "ev.jsonl", world), Ledger(tmp_path / "l.jsonl"),
                           timeout_s=5, clock=lambda: float(next(ticks)), sleep=lambda _s: None)
    assert not report.ok
    assert report.remaining == ["the training job runs on no node"]
    assert report.to_json()["ok"] is False


def test_where_the_workload_is_pods_every_pod_must_run() -> None:
    k8s = dict(job_nodes=("gpu-0", "gpu-1"), last_step_age_s=None, steps_this_incarnation=0)
    ok = TrainingPods("default/train", 2, 2, 0, ("gpu-0", "gpu-1"))
    assert steady.problems(obs(**k8s, pods=ok)) == []
    short = TrainingPods("default/train", 2, 1, 1, ("gpu-1",))
    assert steady.problems(obs(**k8s, pods=short)) == [
        "training job default/train has 1 of 2 pods Running (1 pending)"
    ]
    # Nothing to resubmit, but the plan says the workload is not steady (the backend says why).
    assert steady.heal_plan(obs(**k8s, pods=short)).resume_training is True
    assert steady.heal_plan(obs(**k8s, pods=ok)).resume_training is False


def test_a_node_reporting_a_problem_is_not_steady() -> None:
    sick = NodeObs("gpu-1", "schedulable", "GpuFleetProblem: PROBLEM: XID 79", None, True, problem=True)
    assert steady.problems(obs(nodes={"gpu-1": sick})) == [
        "node gpu-1 reports a problem (GpuFleetProblem: PROBLEM: XID 79)"
    ]


def test_a_firing_alert_is_named_with_where_it_fires() -> None:
    assert steady._alert_name({"alertname": "FabricLinkFlapping", "node": "gpu-0", "device": "fab0"}) == \
        "FabricLinkFlapping{gpu-0}"
    assert steady._alert_name({"alertname": "NodeDown", "host": "h", "node": "n"}) == "NodeDown{h}"
    assert steady._alert_name({"alertname": "Up", "instance": "10.0.0.1:9100"}) == "Up{10.0.0.1:9100}"
