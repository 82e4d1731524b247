"""A simulated fleet that performs a rollout's actions on a model of nodes and jobs and reports what
happens, on a simulated clock. It exists to exercise the state machine at 1,250-node scale (the
property tests, the benchmark); it is not a backend and no figure it yields is a real upgrade.

The world is the truth the tests check the rules against: it records every action that broke one
(a cordon over someone else's, an uncordon of a node the rollout did not cordon, a protected job
interrupted, more nodes out than allowed) instead of trusting the machine's own bookkeeping.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.fleet.upgrade.model import FleetSnapshot, Job, NodeObservation
from gpufleet.fleet.upgrade.rollout import (
    Action,
    Cordon,
    Event,
    Evict,
    GateResult,
    Hold,
    JobEnded,
    JobStarted,
    NodeUnhealthy,
    Reboot,
    RebootDone,
    Rollout,
    RunGate,
    Tick,
    Uncordon,
)

OLD = "550.90.07"
ROLLOUT = "rollout"


@dataclass(frozen=True, slots=True)
class SimParams:
    """A random fleet and how its nodes and jobs behave. Shares are per node (or per action)."""

    seed: int
    nodes: int = 1250
    pools: int = 2
    target: str = "570.124.06"
    precordoned: float = 0.03
    unhealthy: float = 0.01
    up_to_date: float = 0.02
    busy: float = 0.5  # a node runs an unprotected job at the start
    protected: float = 0.05  # a node runs a protected job at the start
    protected_long: float = 0.3  # of protected jobs: they outlast protectedJobWaitSeconds
    arrivals: int = 300  # jobs submitted during the rollout
    arrival_protected: float = 0.2
    gate_fail: float = 0.0
    bad_version: bool = False  # every gate at the target fails
    reboot_hang: float = 0.0
    gate_hang: float = 0.0
    drain_hang: float = 0.0
    rollback_gate_fail: float = 0.0
    wrong_version: float = 0.0  # a reboot comes back at the old version
    protected_wait_seconds: float = 3600.0
    turn_unhealthy: float = 0.0  # nodes that show a fault at a random time during the rollout
    regress: float = 0.0  # upgraded nodes that show a fault soon after they return


@dataclass(slots=True)
class SimNode:
    version: str
    cordoned_by: str | None
    jobs: dict[str, bool] = field(default_factory=dict)  # id -> protected
    down: bool = False
    unhealthy: bool = False  # a fault the backend reported (NodeUnhealthy)
    upgraded: bool = False  # returned to service at the target by the rollout
    cordoned_since: float | None = None
    out_seconds: float = 0.0  # time spent cordoned by the rollout


@dataclass(slots=True)
class _Arrival:
    at: float
    node: str
    job: Job
    length: float


class SimFleet:
    """The world: nodes, jobs, a clock and the events it will report."""

    def __init__(self, params: SimParams, max_unavailable: int) -> None:
        self.p = params
        self.rng = random.Random(params.seed)
        self.max_unavailable = max_unavailable
        self.nodes: dict[str, SimNode] = {}
        self.violations: list[str] = []
        self.out = 0
        self.peak_out = 0
        self.events_handled = 0
        self._heap: list[tuple[float, int, Event | _Arrival]] = []
        self._seq = 0
        self._ticks: set[float] = set()
        self._jobs = 0

    # ------------------------------------------------------------------ building

    def _job(self, protected: bool) -> Job:
        self._jobs += 1
        queue = "prod" if protected else "batch"
        return Job(id=f"j{self._jobs}", name=f"train-{self._jobs}", queue=queue, protected=protected)

    def _protected_length(self) -> float:
        wait = self.p.protected_wait_seconds
        if self.rng.random() < self.p.protected_long:
            return self.rng.uniform(1.5 * wait, 4 * wait)
        return self.rng.uniform(0.05 * wait, 0.9 * wait)

    def snapshot(self) -> FleetSnapshot:
        """Build the random fleet and return what a backend would observe of it at time 0."""
        p, rng = self.p, self.rng
        observed = []
        for i in range(p.nodes):
            name = f"gpu-{i:05d}"
            pool = f"pool-{i % p.pools}"
            version = p.target if rng.random() < p.up_to_date else OLD
            cordoned_by = "ops" if rng.random() < p.precordoned else None
            node = SimNode(version, cordoned_by)
            jobs = []
            if rng.random() < p.busy:
                jobs.append(self._job(False))
            if rng.random() < p.protected:
                jobs.append(self._job(True))
            for job in jobs:
                node.jobs[job.id] = job.protected
                length = self._protected_length() if job.protected else rng.uniform(60, 7200)
                self._push(length, JobEnded(length, name, job.id))
            self.nodes[name] = node
            observed.append(NodeObservation(name=name, pool=pool, version=version, cordoned_by=cordoned_by,
                                            healthy=rng.random() >= p.unhealthy, jobs=jobs))
        horizon = 400.0 * p.nodes / max(1, self.max_unavailable)
        names = list(self.nodes)
        for _ in range(p.arrivals):
            at = rng.uniform(0, horizon)
            protected = rng.random() < p.arrival_protected
            job = self._job(protected)
            length = self._protected_length() if protected else rng.uniform(60, 7200)
            self._push(at, _Arrival(at, rng.choice(names), job, length))
        for name in names:
            if rng.random() < p.turn_unhealthy:
                at = rng.uniform(0, horizon)
                self._push(at, NodeUnhealthy(at, name, "XID 79 (GPU fallen off the bus)"))
        return FleetSnapshot(source="live", nodes=observed)

    # ------------------------------------------------------------------ the clock

    def _push(self, at: float, item: Event | _Arrival) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, item))

    def wake_at(self, at: float | None) -> None:
        if at is not None and at not in self._ticks:
            self._ticks.add(at)
            self._push(at, Tick(at))

    def next_event(self) -> Event | None:
        """The next event the rollout observes; job submissions are settled here."""
        while self._heap:
            _, _, item = heapq.heappop(self._heap)
            if not isinstance(item, _Arrival):
                if isinstance(item, NodeUnhealthy):
                    self.nodes[item.node].unhealthy = True
                if isinstance(item, JobEnded):
                    node = self.nodes[item.node]
                    if node.jobs.pop(item.job_id, None) is None:
                        continue  # already ended
                return item
            node = self.nodes[item.node]
            if node.cordoned_by is not None or node.down:
                continue  # the scheduler places nothing on a drained or rebooting node
            node.jobs[item.job.id] = item.job.protected
            self._push(item.at + item.length, JobEnded(item.at + item.length, item.node, item.job.id))
            return JobStarted(item.at, item.node, item.job)
        return None

    # ------------------------------------------------------------------ actions

    def _violate(self, text: str) -> None:
        self.violations.append(text)

    def apply(self, action: Action, now: float) -> None:
        p, rng = self.p, self.rng
        node = self.nodes[action.node]
        if isinstance(action, Cordon):
            if node.cordoned_by is not None:
                self._violate(f"{action.node}: cordoned over {node.cordoned_by}'s cordon")
            if any(node.jobs.values()):
                self._violate(f"{action.node}: taken while a protected job runs")
            if node.unhealthy:
                self._violate(f"{action.node}: taken after it was reported unhealthy (remediation's)")
            node.cordoned_by = ROLLOUT
            node.cordoned_since = now
            self.out += 1
            self.peak_out = max(self.peak_out, self.out)
            if self.out > self.max_unavailable:
                self._violate(f"{self.out} nodes out, more than maxUnavailable {self.max_unavailable}")
        elif isinstance(action, Evict):
            for job_id in action.jobs:
                if node.jobs.get(job_id):
                    self._violate(f"{action.node}: protected job {job_id} evicted")
                if job_id in node.jobs and rng.random() >= p.drain_hang:
                    at = now + rng.uniform(5, 120)
                    self._push(at, JobEnded(at, action.node, job_id))
        elif isinstance(action, Reboot):
            if node.cordoned_by != ROLLOUT:
                self._violate(f"{action.node}: rebooted without the rollout's cordon")
            if node.jobs:
                self._violate(f"{action.node}: rebooted with jobs still running")
            node.down = True
            if rng.random() >= p.reboot_hang:
                at = now + rng.uniform(60, 300)
                came_back = node.version if rng.random() < p.wrong_version else action.version
                node.version = came_back
                self._push(at, RebootDone(at, action.node, came_back))
        elif isinstance(action, RunGate):
            node.down = False
            if node.cordoned_by != ROLLOUT:
                self._violate(f"{action.node}: gated without the rollout's cordon")
            if rng.random() >= p.gate_hang:
                if node.unhealthy:
                    passed = False  # the gate's inspection checks see the fault
                elif node.version == p.target:
                    passed = not p.bad_version and rng.random() >= p.gate_fail
                else:
                    passed = rng.random() >= p.rollback_gate_fail
                at = now + rng.uniform(60, 600)
                detail = "" if passed else "collective bandwidth 71% of the pool's reference"
                self._push(at, GateResult(at, action.node, passed, detail))
        elif isinstance(action, Uncordon):
            if node.cordoned_by != ROLLOUT:
                self._violate(f"{action.node}: uncordoned, but the rollout did not cordon it")
            else:
                self._release(node, now)
                if node.version == p.target and not node.unhealthy:
                    node.upgraded = True
                    if rng.random() < p.regress:
                        at = now + rng.uniform(1, 900)
                        self._push(at, NodeUnhealthy(at, action.node, "regressed: XID 79"))
            node.cordoned_by = None
        elif isinstance(action, Hold) and node.cordoned_by != ROLLOUT:
            self._violate(f"{action.node}: held, but the rollout did not cordon it")

    def _release(self, node: SimNode, now: float) -> None:
        assert node.cordoned_since is not None
        node.out_seconds += now - node.cordoned_since
        node.cordoned_since = None
        self.out -= 1


Observer = Callable[[Event | None, list[Action]], None]


def drive(
    rollout: Rollout, fleet: SimFleet, observe: Observer | None = None, max_events: int = 2_000_000
) -> None:
    """Run the rollout against the simulated fleet until it finishes or nothing more can happen."""
    actions = rollout.start(0.0)
    for action in actions:
        fleet.apply(action, 0.0)
    if observe is not None:
        observe(None, actions)
    while not rollout.finished and fleet.events_handled < max_events:
        fleet.wake_at(rollout.next_wakeup())
        event = fleet.next_event()
        if event is None:
            return
        fleet.events_handled += 1
        actions = rollout.handle(event)
        for action in actions:
            fleet.apply(action, event.at)
        if observe is not None:
            observe(event, actions)
