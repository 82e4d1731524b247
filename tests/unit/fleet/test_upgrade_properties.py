"""The rollout's safety properties over random 1,250-node fleets (issue 16): random pre-cordoned and
unhealthy nodes, random protected and unprotected jobs (at the start and arriving during the
rollout), random gate failures, bad versions, hung reboots, gates and drains. The simulated fleet
(`simfleet`) is the truth: it records every action that broke a rule, and the checks below read it
after every step of the machine, not the machine's own bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpufleet.config import UpgradeSpec
from gpufleet.fleet.upgrade import (
    Action,
    Cordon,
    Event,
    NodeUnhealthy,
    Phase,
    RolloutPolicy,
    plan_upgrade,
)
from gpufleet.fleet.upgrade.rollout import TERMINAL, Rollout
from gpufleet.fleet.upgrade.simfleet import OLD, ROLLOUT, SimFleet, SimParams, drive

NODES = 1250
EPS = 1e-6


@dataclass
class Scenario:
    params: SimParams
    spec: UpgradeSpec


@st.composite
def scenarios(draw: st.DrawFn, failures: bool = True) -> Scenario:
    wait = draw(st.sampled_from([60.0, 600.0, 3600.0]))
    # One kind of failure per example, at a rate from "about one in the fleet or fewer" to "several
    # per wave", so that halts happen anywhere from the canary to the last wave.
    kinds = ["gate_fail", "reboot_hang", "gate_hang", "wrong_version"]
    kind = draw(st.sampled_from([*kinds, "short_timeouts"])) if failures else None
    chosen = draw(st.sampled_from([0.0001, 0.0005, 0.002, 0.02])) if failures else 0.0
    rates = {k: (chosen if k == kind else 0.0) for k in kinds}
    params = SimParams(
        seed=draw(st.integers(0, 2**32 - 1)),
        nodes=NODES,
        pools=draw(st.integers(1, 4)),
        precordoned=draw(st.floats(0, 0.2)),
        unhealthy=draw(st.floats(0, 0.05)),
        up_to_date=draw(st.floats(0, 0.1)),
        busy=draw(st.floats(0, 1)),
        protected=draw(st.floats(0, 0.3)),
        protected_long=draw(st.floats(0, 1)),
        arrivals=draw(st.integers(0, 600)),
        arrival_protected=draw(st.floats(0, 1)),
        gate_fail=rates["gate_fail"],
        bad_version=failures and draw(st.integers(0, 4)) == 0,
        reboot_hang=rates["reboot_hang"],
        gate_hang=rates["gate_hang"],
        drain_hang=draw(st.sampled_from([0.0, 0.01, 0.2])),
        rollback_gate_fail=draw(st.sampled_from([0.0, 0.5])) if failures else 0.0,
        wrong_version=rates["wrong_version"],
        protected_wait_seconds=wait,
        # Health changes during the rollout: faults on random nodes at random times, and
        # regressions shortly after an upgraded node returns.
        turn_unhealthy=draw(st.sampled_from([0.0, 0.001, 0.02])) if failures else 0.0,
        regress=draw(st.sampled_from([0.0, 0.0, 0.001, 0.01])) if failures else 0.0,
    )
    percent = st.integers(1, 20).map(lambda p: f"{p}%")
    spec = UpgradeSpec.model_validate({
        "canaryNodesPerPool": draw(st.integers(1, 3)),
        "waveSize": draw(st.one_of(st.integers(1, 300), percent)),
        "maxUnavailable": draw(st.one_of(st.integers(1, 64), st.sampled_from(["1%", "2%", "5%"]))),
        "bakeSeconds": draw(st.sampled_from([0.0, 60.0, 600.0])),
        "protectedJobWaitSeconds": wait,
        # The simulated drain takes 5-120 s, a reboot 60-300 s and a gate 60-600 s: the short
        # timeouts fire on their own (for 2-4% of nodes), the long ones only on hangs.
        "drainTimeoutSeconds": draw(st.sampled_from([30.0, 300.0])),
        "rebootTimeoutSeconds": 290.0 if kind == "short_timeouts" else 900.0,
        "gateTimeoutSeconds": 590.0 if kind == "short_timeouts" else 1200.0,
    })
    return Scenario(params, spec)


@dataclass
class Watch:
    """Checks made after every step of the machine, against the simulated fleet."""

    rollout: Rollout
    fleet: SimFleet
    touched: set[str] = field(default_factory=set)
    steps: int = 0
    wave_of: dict[str, int] = field(default_factory=dict)
    last_taken_wave: int = -1
    last_action_in_wave: dict[int, float] = field(default_factory=dict)
    must_halt_at: float | None = None  # a regression arrived inside its wave's bake

    def __post_init__(self) -> None:
        self.wave_of = {n: w.index for w in self.rollout.plan.waves for n in w.nodes}

    def __call__(self, event: Event | None, actions: list[Action]) -> None:
        self.steps += 1
        at = 0.0 if event is None else event.at
        if isinstance(event, NodeUnhealthy) and self.fleet.nodes[event.node].upgraded:
            # Upgraded in the latest wave any node was taken from, before that wave's bake could have
            # ended (the bake starts no earlier than the wave's last action): the machine is still in
            # that wave, so the regression must halt it. Read from the fleet and the plan alone.
            w = self.wave_of.get(event.node)
            bake = self.rollout.policy.bake_seconds
            if w is not None and w == self.last_taken_wave and at < self.last_action_in_wave[w] + bake:
                self.must_halt_at = at if self.must_halt_at is None else self.must_halt_at
        if self.must_halt_at is not None:
            assert self.rollout.halted_by is not None, ("a regression in the bake did not halt", event)
            assert not any(isinstance(a, Cordon) for a in actions), actions
        assert not self.fleet.violations, self.fleet.violations[:5]
        assert self.fleet.out == self.rollout.out <= self.rollout.policy.max_unavailable
        for action in actions:
            w = self.wave_of.get(action.node)
            if w is not None:
                self.last_action_in_wave[w] = at
                if isinstance(action, Cordon):
                    self.last_taken_wave = max(self.last_taken_wave, w)
            self.touched.add(action.node)
            if isinstance(action, Cordon) and self.rollout.halted_at is not None:
                # A halt stops the rollout: no node is taken after it.
                assert event is not None and event.at <= self.rollout.halted_at, action


def run(s: Scenario) -> tuple[Rollout, SimFleet, Watch, Any]:
    policy = RolloutPolicy.resolve(s.spec, NODES)
    fleet = SimFleet(s.params, policy.max_unavailable)
    snapshot = fleet.snapshot()
    plan = plan_upgrade(snapshot, s.spec, s.params.target)
    rollout = Rollout(plan, snapshot)
    watch = Watch(rollout, fleet)
    drive(rollout, fleet, watch)
    return rollout, fleet, watch, plan


def coverage(rollout: Rollout, fleet: SimFleet, watch: Watch) -> None:
    """What the examples covered (pytest --hypothesis-show-statistics)."""
    event("halted" if rollout.halted_by else "ran to the end")
    event(f"nodes touched: {min(len(watch.touched) // 250 * 250, 1000)}+")
    if watch.must_halt_at is not None:
        event("a regression during a bake halted the rollout")
    if any("turned unhealthy" in n.reason for n in rollout.nodes.values()):
        event("a node turned unhealthy before it was taken")
    event(f"peak out {'=' if fleet.peak_out == rollout.policy.max_unavailable else '<'} maxUnavailable")


def check_end(rollout: Rollout, fleet: SimFleet, watch: Watch, s: Scenario) -> None:
    policy = rollout.policy
    assert rollout.finished, rollout.report()["counts"]
    assert watch.steps > 1
    # No pool goes past its canary unless one of its canaries passed.
    canary = set(rollout.plan.waves[0].nodes) if rollout.plan.waves else set()
    proven = {rollout.nodes[n].pool for n in canary if rollout.nodes[n].phase is Phase.DONE}
    assert {rollout.nodes[n].pool for n in watch.touched - canary} <= proven
    for name, node in rollout.nodes.items():
        world = fleet.nodes[name]
        assert node.phase in TERMINAL, (name, node.phase)
        # Within its timeouts: the wait for protected jobs, then the time it was held out.
        assert node.waited_seconds <= policy.protected_job_wait_seconds + EPS, (name, node.waited_seconds)
        if node.taken_at is not None:
            assert node.ended_at is not None
            assert node.ended_at - node.taken_at <= policy.taken_budget_seconds + EPS, name
        # Never uncordon what it did not cordon: someone else's cordon is still there, untouched.
        if world.cordoned_by not in (None, ROLLOUT):
            assert name not in watch.touched, name
        # A node stays cordoned by the rollout only when it is held as failed.
        if world.cordoned_by == ROLLOUT:
            assert node.phase is Phase.FAILED and node.cordoned, name
        if node.phase is Phase.DONE:
            assert world.version == s.params.target, name
        if node.phase is Phase.SKIPPED:
            assert world.version == (s.params.target if name in rollout.plan.up_to_date else OLD), name
            assert world.cordoned_by != ROLLOUT, name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_rule_holds_at_every_step_of_a_random_rollout(s: Scenario) -> None:
    rollout, fleet, watch, plan = run(s)
    coverage(rollout, fleet, watch)
    check_end(rollout, fleet, watch, s)
    failed = [n for n in rollout.nodes.values() if n.phase is Phase.FAILED]
    if failed:
        assert rollout.halted_by is not None
    if s.params.bad_version:
        # A bad version stops at the canary: every other node is untouched.
        canary = set(plan.waves[0].nodes) if plan.waves else set()
        assert watch.touched <= canary
        assert all(fleet.nodes[n].version in (OLD, s.params.target) for n in fleet.nodes)
        assert not any(rollout.nodes[n].phase is Phase.DONE for n in canary)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(failures=False))
def test_without_failures_no_node_fails_and_skips_have_a_named_cause(s: Scenario) -> None:
    rollout, fleet, watch, _ = run(s)
    coverage(rollout, fleet, watch)
    check_end(rollout, fleet, watch, s)
    assert rollout.halted_by is None
    skipped = [n for n in rollout.nodes.values() if n.phase is Phase.SKIPPED]
    skipped_for = {n.reason.split(" ")[0].rstrip(":") for n in skipped}
    assert skipped_for <= {
        "cordoned-by-other", "unhealthy", "protected-job-still-running", "drain-timed-out",
        "no-canary-of-the-pool-passed",
    }, skipped_for
    assert not any(n.phase is Phase.FAILED for n in rollout.nodes.values())


def test_a_bad_version_at_full_scale_stops_at_the_canary() -> None:
    s = Scenario(SimParams(seed=16, bad_version=True, precordoned=0.05, protected=0.1),
                 UpgradeSpec.model_validate({"maxUnavailable": "2%", "canaryNodesPerPool": 2}))
    rollout, fleet, watch, plan = run(s)
    check_end(rollout, fleet, watch, s)
    assert watch.touched == set(plan.waves[0].nodes)
    assert sum(1 for n in fleet.nodes.values() if n.version == s.params.target) == len(plan.up_to_date)
    assert rollout.report()["counts"]["failed"] == len(plan.waves[0].nodes)
