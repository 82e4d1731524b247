"""The rollout state machine: given a plan and what is observed, the next actions.

No I/O and no clock: every event carries its time, and `next_wakeup()` says when the machine next
needs a `Tick` (a timeout or the end of a bake). A driver (Slurm, Kubernetes) performs the actions
and reports what it observes; the unit tests drive it with a simulated fleet.

A node's path: pending -> (waiting for its protected jobs) -> draining (cordoned and marked, other
jobs evicted) -> upgrading (reboot into the target) -> gating -> done, uncordoned. A failed gate (or
a timeout, or a node that comes back at another version) halts the rollout: nothing new is taken,
nodes in flight finish, and the failed node is rebooted back to its old version and gated again;
it returns to service if that gate passes and is otherwise held cordoned for people. The rules:
- never more than `maxUnavailable` nodes cordoned by the rollout at once;
- never uncordon a node the rollout did not cordon (nodes cordoned by others are left out);
- never cordon a node while a protected job runs on it: wait, skip after protectedJobWaitSeconds;
- every node ends done, failed or skipped within its timeouts.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.core.maintenance import held_reason, upgrade_reason
from gpufleet.fleet.upgrade.model import FleetSnapshot, Job, RolloutPolicy
from gpufleet.fleet.upgrade.plan import SkipReason, UpgradePlan

# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Cordon:
    """Stop new work on the node and mark it as the rollout's (Slurm: state=DRAIN reason=<mark>)."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """End or requeue the node's (unprotected) jobs so that it drains."""

    node: str
    jobs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reboot:
    """Install `version` and reboot the node into it."""

    node: str
    version: str


@dataclass(frozen=True, slots=True)
class RunGate:
    """Run the return gate (inspection checks, performance floor, smoke run) on the node."""

    node: str
    version: str


@dataclass(frozen=True, slots=True)
class Uncordon:
    """Return a node the rollout cordoned to service and clear its mark."""

    node: str


@dataclass(frozen=True, slots=True)
class Hold:
    """Leave a node the rollout cordoned out of service, its reason replaced by what went wrong."""

    node: str
    reason: str


Action = Cordon | Evict | Reboot | RunGate | Uncordon | Hold

# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Tick:
    at: float


@dataclass(frozen=True, slots=True)
class JobStarted:
    at: float
    node: str
    job: Job


@dataclass(frozen=True, slots=True)
class JobEnded:
    at: float
    node: str
    job_id: str


@dataclass(frozen=True, slots=True)
class RebootDone:
    at: float
    node: str
    version: str  # what the node reports after the reboot


@dataclass(frozen=True, slots=True)
class GateResult:
    at: float
    node: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NodeUnhealthy:
    """The backend saw a fault on the node (its health source, not the gate): before the rollout
    takes a node, it is left to remediation; on a node the rollout upgraded, during its wave or the
    bake after it, it is a regression that halts the rollout. A node under upgrade is the gate's."""

    at: float
    node: str
    detail: str = ""


Event = Tick | JobStarted | JobEnded | RebootDone | GateResult | NodeUnhealthy

# --------------------------------------------------------------------------- nodes


class Phase(StrEnum):
    PENDING = "pending"
    WAITING = "waiting-for-protected-job"
    DRAINING = "draining"
    UPGRADING = "upgrading"
    GATING = "gating"
    ROLLING_BACK = "rolling-back"
    REGATING = "gating-old-version"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


TERMINAL = frozenset({Phase.DONE, Phase.FAILED, Phase.SKIPPED})


@dataclass(slots=True)
class NodeProgress:
    name: str
    pool: str
    wave: int | None  # None: not in the plan
    old_version: str | None
    phase: Phase = Phase.PENDING
    reason: str = ""
    jobs: dict[str, bool] = field(default_factory=dict)  # job id -> protected
    cordoned: bool = False  # by this rollout
    token: int = 0  # bumped on every phase change; a timeout armed in an older phase is stale
    deadline: float | None = None
    wait_started: float | None = None  # the current stint of waiting for protected jobs
    wait_deadline: float | None = None  # fixed at the first stint: the whole wait is bounded
    waited_seconds: float = 0.0
    taken_at: float | None = None
    ended_at: float | None = None

    @property
    def protected(self) -> bool:
        return any(self.jobs.values())


class RolloutError(ValueError):
    """The plan cannot be run (e.g. a node's current version is unknown, so it could not be
    rolled back)."""


class Rollout:
    """One rollout of a plan. Call `start(at)`, then `handle(event)` for every observation."""

    def __init__(self, plan: UpgradePlan, snapshot: FleetSnapshot, rollout_id: str = "r1") -> None:
        self.plan = plan
        self.policy: RolloutPolicy = plan.policy
        self.target = plan.target
        self.mark = upgrade_reason(rollout_id, plan.component.value, plan.target)
        wave_of = {n: w.index for w in plan.waves for n in w.nodes}
        self.nodes: dict[str, NodeProgress] = {}
        unknown = []
        for obs in snapshot.nodes:
            wave = wave_of.get(obs.name)
            if wave is not None and obs.version is None:
                unknown.append(obs.name)
            self.nodes[obs.name] = NodeProgress(
                obs.name, obs.pool, wave, obs.version, jobs={j.id: j.protected for j in obs.jobs}
            )
        if unknown:
            raise RolloutError(
                f"{len(unknown)} planned node(s) have no known current version ({', '.join(unknown[:5])}"
                f"{', ...' if len(unknown) > 5 else ''}): a rollback needs it; plan from a live snapshot"
            )
        self.now = 0.0
        self.started = False
        self.wave = -1
        self.bake_until: float | None = None
        self.halted_by: str | None = None
        self.halted_at: float | None = None
        self.finished = False
        self.out = 0  # nodes cordoned by the rollout right now
        self.peak_out = 0
        self._queue: deque[str] = deque()  # the current wave's nodes not yet started
        self._ready: deque[str] = deque()  # nodes whose protected jobs ended, first in line
        self._open: list[int] = [len(w.nodes) for w in plan.waves]  # unsettled nodes per wave
        self._timeouts: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self._actions: list[Action] = []

    # ------------------------------------------------------------------ public

    def start(self, at: float) -> list[Action]:
        self.now = at
        self.started = True
        for skip in self.plan.left_out:
            self._settle(self.nodes[skip.node], Phase.SKIPPED, f"{skip.reason.value}: {skip.detail}")
        for name in self.plan.up_to_date:
            self._settle(self.nodes[name], Phase.DONE, "already at the target")
        self._next_wave()
        self._progress()
        return self._flush()

    def handle(self, event: Event) -> list[Action]:
        if not self.started:
            raise RolloutError("start() the rollout before handing it events")
        if event.at < self.now:
            raise RolloutError(f"event at {event.at} is earlier than the last one ({self.now})")
        self.now = event.at
        self._expire()
        if isinstance(event, JobStarted):
            self._job_started(event)
        elif isinstance(event, JobEnded):
            self._job_ended(event)
        elif isinstance(event, RebootDone):
            self._reboot_done(event)
        elif isinstance(event, GateResult):
            self._gate_result(event)
        elif isinstance(event, NodeUnhealthy):
            self._node_unhealthy(event)
        self._progress()
        return self._flush()

    def watched(self) -> list[str]:
        """The nodes whose health the backend should report (NodeUnhealthy): those not yet taken
        (in the current wave or a later one) and those upgraded in the current wave, whose bake a
        regression ends. Nodes in flight are the gate's; others are remediation's alone."""
        if self.finished or self.halted_by is not None:
            return []
        return [n.name for n in self.nodes.values()
                if (n.phase in (Phase.PENDING, Phase.WAITING) and n.wave is not None)
                or (n.phase is Phase.DONE and n.taken_at is not None and n.wave == self.wave)]

    def next_wakeup(self) -> float | None:
        """When the machine next needs a Tick: its earliest armed timeout or the end of a bake."""
        if self.finished:
            return None
        times = [self._timeouts[0][0]] if self._timeouts else []
        if self.bake_until is not None:
            times.append(self.bake_until)
        return min(times) if times else None

    def report(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for n in self.nodes.values():
            counts[n.phase.value] = counts.get(n.phase.value, 0) + 1
        return {
            "target": self.target,
            "finished": self.finished,
            "haltedBy": self.halted_by,
            "haltedAt": self.halted_at,
            "peakUnavailable": self.peak_out,
            "maxUnavailable": self.policy.max_unavailable,
            "counts": dict(sorted(counts.items())),
            "nodes": [
                {"node": n.name, "phase": n.phase.value, "reason": n.reason, "wave": n.wave}
                for n in self.nodes.values()
                if n.phase is not Phase.DONE or n.reason
            ],
        }

    # ------------------------------------------------------------------ transitions

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _flush(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def _enter(self, node: NodeProgress, phase: Phase, timeout: float | None = None) -> None:
        node.phase = phase
        node.token += 1
        node.deadline = None if timeout is None else self.now + timeout
        if node.deadline is not None:
            self._seq += 1
            heapq.heappush(self._timeouts, (node.deadline, self._seq, node.name, node.token))

    def _settle(self, node: NodeProgress, phase: Phase, reason: str) -> None:
        if node.phase is Phase.WAITING and node.wait_started is not None:
            node.waited_seconds += self.now - node.wait_started
        self._enter(node, phase)
        node.reason = reason
        node.ended_at = self.now
        if node.wave is not None and node.wave < len(self._open):
            self._open[node.wave] -= 1

    def _uncordon(self, node: NodeProgress) -> None:
        assert node.cordoned, f"{node.name}: the rollout never cordons what it did not cordon"
        node.cordoned = False
        self.out -= 1
        self._emit(Uncordon(node.name))

    def _halt(self, why: str) -> None:
        if self.halted_by is not None:
            return
        self.halted_by = why
        self.halted_at = self.now
        self.bake_until = None
        # Nothing new is taken: every node not yet taken, in this wave or a later one, is skipped.
        for name in [*self._ready, *self._queue]:
            node = self.nodes[name]
            if node.phase is Phase.PENDING:
                self._settle(node, Phase.SKIPPED, f"{SkipReason.HALTED.value}: {why}")
        self._ready.clear()
        self._queue.clear()
        for node in self.nodes.values():
            later = node.phase is Phase.PENDING and node.wave is not None and node.wave > self.wave
            if node.phase is Phase.WAITING or later:
                self._settle(node, Phase.SKIPPED, f"{SkipReason.HALTED.value}: {why}")

    def _fail(self, node: NodeProgress, why: str) -> None:
        """The new version failed on this node: halt and roll the node back."""
        self._halt(f"{node.name}: {why}")
        assert node.old_version is not None
        node.reason = why
        self._enter(node, Phase.ROLLING_BACK, self.policy.reboot_timeout_seconds)
        self._emit(Reboot(node.name, node.old_version))

    def _hold(self, node: NodeProgress, why: str) -> None:
        self._halt(f"{node.name}: {why}")
        self._emit(Hold(node.name, held_reason(why)))
        self._settle(node, Phase.FAILED, why)

    def _take(self, node: NodeProgress) -> None:
        node.cordoned = True
        node.taken_at = self.now
        self.out += 1
        self.peak_out = max(self.peak_out, self.out)
        self._emit(Cordon(node.name, self.mark))
        if node.jobs:
            self._enter(node, Phase.DRAINING, self.policy.drain_timeout_seconds)
            self._emit(Evict(node.name, tuple(sorted(node.jobs))))
        else:
            self._upgrade(node)

    def _upgrade(self, node: NodeProgress) -> None:
        self._enter(node, Phase.UPGRADING, self.policy.reboot_timeout_seconds)
        self._emit(Reboot(node.name, self.target))

    def _wait(self, node: NodeProgress) -> None:
        if node.wait_deadline is None:
            node.wait_deadline = self.now + self.policy.protected_job_wait_seconds
        deadline = node.wait_deadline
        if self.now >= deadline:
            self._settle(node, Phase.SKIPPED, f"{SkipReason.PROTECTED_JOB.value} after "
                                               f"{self.policy.protected_job_wait_seconds:g} s")
            return
        node.wait_started = self.now
        self._enter(node, Phase.WAITING, deadline - self.now)

    # ------------------------------------------------------------------ events

    def _job_started(self, ev: JobStarted) -> None:
        node = self.nodes.get(ev.node)
        if node is None:
            return
        node.jobs[ev.job.id] = ev.job.protected
        if node.phase is Phase.DRAINING and ev.job.protected:
            # The scheduler placed a protected job on a node we had cordoned (a race with the
            # cordon): give the node back rather than interrupt the job.
            self._uncordon(node)
            self._settle(node, Phase.SKIPPED, SkipReason.PROTECTED_JOB_ON_CORDONED.value)
        elif node.phase is Phase.DRAINING:
            self._emit(Evict(node.name, (ev.job.id,)))

    def _job_ended(self, ev: JobEnded) -> None:
        node = self.nodes.get(ev.node)
        if node is None:
            return
        node.jobs.pop(ev.job_id, None)
        if node.phase is Phase.WAITING and not node.protected:
            assert node.wait_started is not None
            node.waited_seconds += self.now - node.wait_started
            node.wait_started = None
            self._enter(node, Phase.PENDING)
            self._ready.append(node.name)
        elif node.phase is Phase.DRAINING and not node.jobs:
            self._upgrade(node)

    def _reboot_done(self, ev: RebootDone) -> None:
        node = self.nodes[ev.node]
        if node.phase is Phase.UPGRADING:
            if ev.version == self.target:
                self._enter(node, Phase.GATING, self.policy.gate_timeout_seconds)
                self._emit(RunGate(node.name, self.target))
            else:
                self._fail(node, f"came back at version {ev.version}, not {self.target}")
        elif node.phase is Phase.ROLLING_BACK:
            if ev.version == node.old_version:
                self._enter(node, Phase.REGATING, self.policy.gate_timeout_seconds)
                self._emit(RunGate(node.name, ev.version))
            else:
                self._hold(node, f"rollback came back at version {ev.version}, not {node.old_version}")

    def _gate_result(self, ev: GateResult) -> None:
        node = self.nodes[ev.node]
        if node.phase is Phase.GATING:
            if ev.passed:
                self._uncordon(node)
                self._settle(node, Phase.DONE, "")
            else:
                self._fail(node, f"gate failed at {self.target}: {ev.detail}".rstrip(": "))
        elif node.phase is Phase.REGATING:
            if ev.passed:
                self._uncordon(node)
                self._settle(node, Phase.FAILED, f"{node.reason}; rolled back to {node.old_version}")
            else:
                self._hold(node, f"{node.reason}; gate failed after the rollback too")

    def _node_unhealthy(self, ev: NodeUnhealthy) -> None:
        node = self.nodes.get(ev.node)
        if node is None or node.wave is None:
            return
        detail = f": {ev.detail}" if ev.detail else ""
        if node.phase in (Phase.PENDING, Phase.WAITING):
            # Not taken yet: remediation owns a faulty node; the rollout must not drain or reboot it
            # under remediation's feet (the planner's rule for the snapshot, applied to later news).
            self._settle(node, Phase.SKIPPED, f"{SkipReason.UNHEALTHY.value} (turned unhealthy before it "
                                               f"was taken){detail}")
        elif (node.phase is Phase.DONE and node.taken_at is not None and node.wave == self.wave
              and self.halted_by is None):
            # Upgraded in this wave and faulty before the next wave starts: the new version is suspect,
            # so nothing more is taken. The node is already back in service without the rollout's mark,
            # so it is remediation's (the rollout does not take it again: that could exceed
            # maxUnavailable and fight remediation); it ends failed with the reason.
            why = f"regressed after the upgrade, before the next wave{detail}"
            self._halt(f"{node.name}: {why}")
            node.phase = Phase.FAILED
            node.token += 1
            node.reason = why

    def _expire(self) -> None:
        reboot, gate = self.policy.reboot_timeout_seconds, self.policy.gate_timeout_seconds
        while self._timeouts and self._timeouts[0][0] <= self.now:
            _, _, name, token = heapq.heappop(self._timeouts)
            node = self.nodes[name]
            if node.token != token:
                continue
            if node.phase is Phase.WAITING:
                self._settle(node, Phase.SKIPPED, f"{SkipReason.PROTECTED_JOB.value} after "
                                                   f"{self.policy.protected_job_wait_seconds:g} s")
            elif node.phase is Phase.DRAINING:
                self._uncordon(node)
                self._settle(node, Phase.SKIPPED, f"{SkipReason.DRAIN_TIMEOUT.value} after "
                                                   f"{self.policy.drain_timeout_seconds:g} s")
            elif node.phase is Phase.UPGRADING:
                # A node that does not come back cannot be rolled back from here: hold it.
                self._hold(node, f"no reboot into {self.target} within {reboot:g} s")
            elif node.phase is Phase.GATING:
                self._fail(node, f"gate gave no result within {gate:g} s")
            elif node.phase is Phase.ROLLING_BACK:
                self._hold(node, f"{node.reason}; no reboot back within {reboot:g} s")
            elif node.phase is Phase.REGATING:
                self._hold(node, f"{node.reason}; gate after the rollback gave no result")

    # ------------------------------------------------------------------ waves

    def _next_wave(self) -> None:
        self.bake_until = None
        self.wave += 1
        if self.wave >= len(self.plan.waves):
            return
        if self.wave == 1:
            self._skip_pools_without_canary()
        wave = self.plan.waves[self.wave].nodes
        self._queue = deque(n for n in wave if self.nodes[n].phase is Phase.PENDING)

    def _skip_pools_without_canary(self) -> None:
        """A pool none of whose canaries passed is not upgraded: nothing proved the version on it."""
        proven = {self.nodes[n].pool for n in self.plan.waves[0].nodes if self.nodes[n].phase is Phase.DONE}
        for node in self.nodes.values():
            if (node.wave is not None and node.wave > 0 and node.pool not in proven
                    and node.phase is Phase.PENDING):
                self._settle(node, Phase.SKIPPED, SkipReason.NO_CANARY.value)

    def _fill(self) -> None:
        """Take nodes of the current wave while fewer than maxUnavailable are out."""
        while self.halted_by is None and self.out < self.policy.max_unavailable:
            if self._ready:
                name = self._ready.popleft()
            elif self._queue:
                name = self._queue.popleft()
            else:
                return
            node = self.nodes[name]
            if node.phase is not Phase.PENDING:
                continue
            if node.protected:
                self._wait(node)
            else:
                self._take(node)

    def _progress(self) -> None:
        while not self.finished:
            if self.bake_until is not None:
                if self.now < self.bake_until:
                    return
                self._next_wave()
                continue
            self._fill()
            if self.wave < len(self.plan.waves) and self._open[self.wave] > 0:
                return
            if self.halted_by is not None or self.wave + 1 >= len(self.plan.waves):
                self.finished = all(n.phase in TERMINAL for n in self.nodes.values())
                return
            if self.policy.bake_seconds > 0:
                self.bake_until = self.now + self.policy.bake_seconds
            else:
                self._next_wave()
