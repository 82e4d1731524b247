"""The rollout state machine, step by step on small fleets: exact actions for exact events."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.config import UpgradeSpec
from gpufleet.fleet.upgrade import (
    Cordon,
    Evict,
    FleetSnapshot,
    GateResult,
    Hold,
    Job,
    JobEnded,
    JobStarted,
    NodeObservation,
    NodeUnhealthy,
    Phase,
    Reboot,
    RebootDone,
    Rollout,
    RolloutError,
    RunGate,
    Tick,
    Uncordon,
    plan_upgrade,
    under_upgrade,
)

OLD, NEW = "550.90.07", "570.124.06"
MARK = f"gpufleet-upgrade r1: driver -> {NEW}"


def rollout(nodes: list[NodeObservation], **spec: Any) -> Rollout:
    snap = FleetSnapshot(source="live", nodes=nodes)
    return Rollout(plan_upgrade(snap, UpgradeSpec.model_validate(spec), NEW), snap)


def node(name: str, pool: str = "a", **kw: Any) -> NodeObservation:
    return NodeObservation(name=name, pool=pool, version=OLD, **kw)


def phase(r: Rollout, name: str) -> Phase:
    return r.nodes[name].phase


def upgrade_one(r: Rollout, name: str, t: float) -> None:
    assert r.handle(RebootDone(t, name, NEW)) == [RunGate(name, NEW)]


def test_one_idle_node_is_cordoned_rebooted_gated_and_returned() -> None:
    r = rollout([node("n0")])
    assert r.start(0) == [Cordon("n0", MARK), Reboot("n0", NEW)]
    assert under_upgrade(MARK)
    upgrade_one(r, "n0", 100)
    assert r.handle(GateResult(200, "n0", True)) == [Uncordon("n0")]
    assert r.finished and phase(r, "n0") is Phase.DONE


def test_a_busy_node_is_drained_before_its_reboot() -> None:
    r = rollout([node("n0", jobs=[Job(id="j1"), Job(id="j2")])])
    assert r.start(0) == [Cordon("n0", MARK), Evict("n0", ("j1", "j2"))]
    assert r.handle(JobEnded(10, "n0", "j1")) == []
    assert r.handle(JobEnded(20, "n0", "j2")) == [Reboot("n0", NEW)]


def test_a_protected_job_is_waited_for_and_never_interrupted() -> None:
    nodes = [node("n0", jobs=[Job(id="p", protected=True)]), node("n1", jobs=[Job(id="p2", protected=True)])]
    r = rollout(nodes, waveSize=2, protectedJobWaitSeconds=100, bakeSeconds=0)
    # n0 is the canary (equally busy, first in order), n1 is wave 1. n0 waits: nothing is cordoned.
    assert r.start(0) == []
    assert phase(r, "n0") is Phase.WAITING
    assert r.next_wakeup() == 100
    assert r.handle(JobEnded(40, "n0", "p")) == [Cordon("n0", MARK), Reboot("n0", NEW)]
    upgrade_one(r, "n0", 50)
    assert r.handle(GateResult(60, "n0", True)) == [Uncordon("n0")]
    # n1's protected job outlasts the wait: skipped at 60 + 100, never cordoned.
    assert phase(r, "n1") is Phase.WAITING
    assert r.handle(Tick(160)) == []
    assert phase(r, "n1") is Phase.SKIPPED
    assert "protected-job-still-running" in r.nodes["n1"].reason
    assert r.finished


def test_a_failed_gate_halts_and_rolls_back_only_that_node() -> None:
    r = rollout([node(f"n{i}") for i in range(4)], waveSize=10, maxUnavailable=1, bakeSeconds=0)
    r.start(0)
    upgrade_one(r, "n0", 10)
    assert r.handle(GateResult(20, "n0", False, "bandwidth 71%")) == [Reboot("n0", OLD)]
    assert r.halted_by is not None and "n0" in r.halted_by
    assert all(r.nodes[f"n{i}"].phase is Phase.SKIPPED for i in (1, 2, 3))
    assert r.handle(RebootDone(30, "n0", OLD)) == [RunGate("n0", OLD)]
    assert r.handle(GateResult(40, "n0", True)) == [Uncordon("n0")]
    assert phase(r, "n0") is Phase.FAILED and "rolled back to 550.90.07" in r.nodes["n0"].reason
    assert r.finished


def test_a_rollback_whose_gate_fails_holds_the_node_cordoned() -> None:
    r = rollout([node("n0")])
    r.start(0)
    upgrade_one(r, "n0", 10)
    r.handle(GateResult(20, "n0", False))
    r.handle(RebootDone(30, "n0", OLD))
    [hold] = r.handle(GateResult(40, "n0", False))
    assert isinstance(hold, Hold) and hold.node == "n0" and "gate failed after the rollback" in hold.reason
    assert not under_upgrade(hold.reason)  # handed over: remediation and people may act on it
    assert r.nodes["n0"].cordoned and r.finished


def test_waves_wait_for_the_bake() -> None:
    r = rollout([node("n0"), node("n1")], bakeSeconds=300)
    r.start(0)
    upgrade_one(r, "n0", 10)
    assert r.handle(GateResult(20, "n0", True)) == [Uncordon("n0")]
    assert r.next_wakeup() == 320
    assert r.handle(Tick(319)) == []
    assert r.handle(Tick(320)) == [Cordon("n1", MARK), Reboot("n1", NEW)]


def test_timeouts() -> None:
    # drain timeout: uncordoned and skipped, the rollout goes on
    nodes = [node("n0", jobs=[Job(id="j")]), node("n1")]
    r = rollout(nodes, waveSize=5, bakeSeconds=0, drainTimeoutSeconds=50)
    assert r.start(0) == [Cordon("n1", MARK), Reboot("n1", NEW)]  # the idle node is the canary
    upgrade_one(r, "n1", 10)
    r.handle(GateResult(20, "n1", True))
    assert phase(r, "n0") is Phase.DRAINING
    assert r.handle(Tick(70)) == [Uncordon("n0")]
    assert phase(r, "n0") is Phase.SKIPPED and r.halted_by is None and r.finished
    # a reboot that never comes back: held and halted
    r = rollout([node("n0"), node("n1")], rebootTimeoutSeconds=60)
    r.start(0)
    [hold] = r.handle(Tick(60))
    assert isinstance(hold, Hold) and r.halted_by is not None
    assert phase(r, "n1") is Phase.SKIPPED and r.finished
    # a gate that gives no answer counts as failed
    r = rollout([node("n0")], gateTimeoutSeconds=30)
    r.start(0)
    upgrade_one(r, "n0", 10)
    assert r.handle(Tick(40)) == [Reboot("n0", OLD)]


def test_a_node_back_at_the_wrong_version_is_a_failure() -> None:
    r = rollout([node("n0")])
    r.start(0)
    assert r.handle(RebootDone(10, "n0", OLD)) == [Reboot("n0", OLD)]
    assert r.halted_by is not None and "came back at version" in r.halted_by


def test_a_pool_whose_canary_was_skipped_is_not_upgraded() -> None:
    nodes = [node("a0", jobs=[Job(id="p", protected=True)]), node("a1", jobs=[Job(id="q", protected=True)]),
             node("b0", "b"), node("b1", "b")]
    r = rollout(nodes, bakeSeconds=0, protectedJobWaitSeconds=10, maxUnavailable=2)
    r.start(0)
    upgrade_one(r, "b0", 5)
    r.handle(GateResult(6, "b0", True))
    r.handle(Tick(10))  # a0's wait ends: skipped, so pool a has no passed canary
    assert phase(r, "a0") is Phase.SKIPPED
    assert phase(r, "a1") is Phase.SKIPPED and r.nodes["a1"].reason == "no-canary-of-the-pool-passed"
    assert phase(r, "b1") is Phase.UPGRADING


def test_a_protected_job_placed_on_a_draining_node_gives_the_node_back() -> None:
    r = rollout([node("n0", jobs=[Job(id="j")])])
    r.start(0)
    assert r.handle(JobStarted(5, "n0", Job(id="p", protected=True))) == [Uncordon("n0")]
    assert phase(r, "n0") is Phase.SKIPPED and r.out == 0


def test_refusals() -> None:
    with pytest.raises(RolloutError, match="no known current version"):
        snap = FleetSnapshot(source="stack", nodes=[NodeObservation(name="n0", pool="a")])
        Rollout(plan_upgrade(snap, UpgradeSpec(), NEW), snap)
    r = rollout([node("n0")])
    with pytest.raises(RolloutError, match="start"):
        r.handle(Tick(0))
    r.start(10)
    with pytest.raises(RolloutError, match="earlier"):
        r.handle(Tick(5))


def test_the_wait_for_protected_jobs_is_bounded_from_its_first_start() -> None:
    nodes = [node("n0"), node("n1", jobs=[Job(id="p1", protected=True)]), node("n2")]
    r = rollout(nodes, waveSize=5, maxUnavailable=1, bakeSeconds=0, protectedJobWaitSeconds=100)
    r.start(0)
    upgrade_one(r, "n0", 10)
    # Wave 1: n1 waits (until 20 + 100), n2 is taken.
    assert r.handle(GateResult(20, "n0", True)) == [Uncordon("n0"), Cordon("n2", MARK), Reboot("n2", NEW)]
    r.handle(JobEnded(30, "n1", "p1"))  # n1 is free but n2 holds the only slot
    r.handle(JobStarted(40, "n1", Job(id="p2", protected=True)))  # and a new protected job lands
    upgrade_one(r, "n2", 45)
    assert r.handle(GateResult(50, "n2", True)) == [Uncordon("n2")]
    assert phase(r, "n1") is Phase.WAITING and r.next_wakeup() == 120
    assert r.handle(Tick(120)) == []
    assert phase(r, "n1") is Phase.SKIPPED and r.nodes["n1"].waited_seconds == 80
    assert r.finished


# --------------------------------------------------------------------------- health changes


def test_a_node_that_turns_unhealthy_while_pending_is_skipped_not_taken() -> None:
    r = rollout([node("n0"), node("n1"), node("n2")], bakeSeconds=0)
    r.start(0)
    assert set(r.watched()) == {"n1", "n2"}  # n0 is in flight: the gate's
    assert r.handle(NodeUnhealthy(5, "n1", "XID 79 on GPU 3")) == []
    assert phase(r, "n1") is Phase.SKIPPED and "turned unhealthy" in r.nodes["n1"].reason
    upgrade_one(r, "n0", 10)
    # n1 is never taken: the next node is n2.
    assert r.handle(GateResult(20, "n0", True)) == [Uncordon("n0"), Cordon("n2", MARK), Reboot("n2", NEW)]
    upgrade_one(r, "n2", 30)
    assert r.handle(GateResult(40, "n2", True)) == [Uncordon("n2")]
    assert r.finished and r.halted_by is None
    assert r.report()["counts"] == {"done": 2, "skipped": 1}


def test_a_waiting_node_that_turns_unhealthy_is_skipped_with_its_wait_counted() -> None:
    r = rollout([node("n0", jobs=[Job(id="p", protected=True)])], protectedJobWaitSeconds=100)
    assert r.start(0) == []
    assert r.watched() == ["n0"]
    r.handle(NodeUnhealthy(30, "n0"))
    assert phase(r, "n0") is Phase.SKIPPED and r.nodes["n0"].waited_seconds == 30
    assert r.finished


def test_a_regression_during_the_bake_halts_the_rollout() -> None:
    r = rollout([node("n0"), node("n1"), node("n2")], bakeSeconds=300)
    r.start(0)
    upgrade_one(r, "n0", 10)
    r.handle(GateResult(20, "n0", True))
    assert "n0" in r.watched()  # upgraded in the current wave: its bake is running
    assert r.handle(NodeUnhealthy(100, "n0", "XID 79")) == []  # no action: it is back in service
    assert r.halted_by is not None and "n0" in r.halted_by and r.finished
    assert phase(r, "n0") is Phase.FAILED and "regressed" in r.nodes["n0"].reason
    assert {phase(r, "n1"), phase(r, "n2")} == {Phase.SKIPPED}
    assert r.next_wakeup() is None and r.watched() == []


def test_a_fault_on_a_node_upgraded_in_an_earlier_wave_is_remediations_not_a_halt() -> None:
    r = rollout([node("n0"), node("n1"), node("n2")], bakeSeconds=10)
    r.start(0)
    upgrade_one(r, "n0", 1)
    r.handle(GateResult(2, "n0", True))
    assert r.handle(Tick(12)) == [Cordon("n1", MARK), Reboot("n1", NEW)]
    assert "n0" not in r.watched()
    assert r.handle(NodeUnhealthy(13, "n0")) == []
    assert r.halted_by is None and phase(r, "n0") is Phase.DONE


def test_a_fault_on_a_node_in_flight_is_left_to_the_gate() -> None:
    r = rollout([node("n0")])
    r.start(0)
    assert r.handle(NodeUnhealthy(1, "n0", "XID 79")) == []
    assert phase(r, "n0") is Phase.UPGRADING and r.halted_by is None
    upgrade_one(r, "n0", 5)
    # The gate sees the fault: fails, rolls back, halts.
    assert r.handle(GateResult(6, "n0", False, "GFI002 gpu-xid")) == [Reboot("n0", OLD)]
    assert r.halted_by is not None


def test_a_later_waves_node_that_turns_unhealthy_before_its_wave_is_skipped_once() -> None:
    # Two pools: canaries a0 and b0; a1 is in wave 1 and turns unhealthy during the canary.
    r = rollout([node("a0", pool="a"), node("a1", pool="a"), node("b0", pool="b")], bakeSeconds=0,
                maxUnavailable=2)
    r.start(0)
    assert r.plan.waves[0].nodes == ("a0", "b0")
    r.handle(NodeUnhealthy(1, "a1"))
    assert phase(r, "a1") is Phase.SKIPPED
    for n in ("a0", "b0"):
        upgrade_one(r, n, 2)
    for n in ("a0", "b0"):
        r.handle(GateResult(3, n, True))
    # The pool-canary rule does not settle a1 a second time (it would count the wave down twice).
    assert r.finished and r.report()["counts"] == {"done": 2, "skipped": 1}
    assert "turned unhealthy" in r.nodes["a1"].reason
