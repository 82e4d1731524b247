"""One Monte Carlo replication: the cluster, its faults and one large training job (SimPy).

Design for speed (benchmarks/simulate.py): there is no SimPy process per node. Each powered node
carries one clock per arrival law (one exponential clock for all its exponential fault classes,
one per Weibull class), scheduled as a bare SimPy timeout with a callback; a clock that would ring
after the horizon is never scheduled, so a replication costs about one event per fault. Clocks are
renewed when a node (re)enters service, and invalidated by a per-node version number when it leaves.
The job is no SimPy process either: a state machine whose wake-ups carry a version number, re-planned
at every disturbance (30% less CPU than a process with interrupts, the same results seed by seed).
Correlated faults (a leaf switch, the storage back-end) come from one fleet-level process.

Checkpoints are not events: the job's running periods are recorded and the work they saved is
computed afterwards (`gpufleet.sim.accounting`) for any checkpoint interval and write cost, because
the fault process does not depend on them. One random stream per stochastic process (STYLE.md 11).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from collections.abc import Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import simpy

from gpufleet.core.breaker import breaker_threshold
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sim.params import SimParams

JOB, WARM, COLD, DOWN = 0, 1, 2, 3

# One stream per stochastic process; new streams are appended so the earlier ones keep their
# spawn keys (a replication's faults stay the same when a later model addition is off).
STREAMS = ("node-clocks", "fault-kind", "domain-clocks", "domain-pick", "repair", "lemons",
           "checkpoint-saves", "measured-handling")

# Ladder ranks looked up once (LadderAction.rank walks the enum on every call).
_RANK = {a: i for i, a in enumerate(LadderAction)}
_ISOLATES = frozenset(a for a in LadderAction if a.isolates_node)

PLANNED = -2  # run_cause of a period ended by a planned drain (upgrade wave): saved, not lost
STORE_DOWN, STORE_DEGRADED = 0, 1
STORE_CLASSES = {FaultClass.STORAGE_OUTAGE: STORE_DOWN, FaultClass.STORAGE_DEGRADED: STORE_DEGRADED}


@dataclass(frozen=True)
class ReplicationResult:
    """What one replication observed; every metric is derived from these."""

    horizon_seconds: float
    run_start: np.ndarray  # the job's running periods
    run_end: np.ndarray
    run_cause: np.ndarray  # kind index that ended the period; -1 = the horizon, -2 = planned drain
    down_seconds_by_kind: np.ndarray  # job not running (detect, isolate, wait, restart), by kind
    interruptions_by_kind: np.ndarray  # faults that hit the job, by kind
    faults_by_kind: np.ndarray  # every fault in the fleet, by kind
    node_down_seconds: float  # node-seconds out of service (isolated, repairing, domain down)
    total_nodes: int
    spares_exhausted: bool  # the job needed a node and no spare was left
    wait_for_nodes_seconds: float
    breaker_trips: int
    events: int
    # one uniform per running period: how many of its last saves failed (checkpoint_failure_probability)
    run_save_u: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # checkpoint store windows: [start, end) with state STORE_DOWN (saves fail, restores wait) or
    # STORE_DEGRADED (saves and loads take store_degraded_factor times longer)
    store_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    store_end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    store_state: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    planned_down_seconds: float = 0.0  # job stopped for planned drains (upgrade waves)

    @property
    def interruptions(self) -> int:
        return int(self.interruptions_by_kind.sum())


@dataclass(frozen=True)
class _Clock:
    rate_per_second: float  # before the node's multiplier
    shape: float
    kinds: tuple[int, ...]
    cumulative: tuple[float, ...]  # cumulative kind weights, last = 1


def _clocks(p: SimParams) -> tuple[list[_Clock], list[int]]:
    """Node-level clocks (exponential classes merged) and the kinds of fleet-level domain faults."""
    expo: list[int] = []
    weibull: dict[FaultClass, list[int]] = {}
    domain: list[int] = []
    for i, k in enumerate(p.kinds):
        if k.per_node_hour <= 0:
            continue
        h = p.handling[k.fault_class]
        if h.domain != "node" or k.fault_class in STORE_CLASSES:
            domain.append(i)
        elif h.weibull_shape == 1.0:
            expo.append(i)
        else:
            weibull.setdefault(k.fault_class, []).append(i)
    groups: list[tuple[float, list[int]]] = []
    if expo:
        groups.append((1.0, expo))
    groups += [(p.handling[c].weibull_shape, idx) for c, idx in weibull.items()]
    clocks = []
    for shape, idx in groups:
        rates = [p.kinds[i].per_node_hour for i in idx]
        total = sum(rates)
        cum = tuple(float(x) for x in np.cumsum(rates) / total)
        clocks.append(_Clock(total / 3600.0, shape, tuple(idx), (*cum[:-1], 1.0)))
    return clocks, domain


@dataclass(frozen=True)
class ScriptedFault:
    """A fault at a fixed time, for hand-computed checks (and replays of a recorded incident).

    `node` picks the node (node faults) or a node of the domain (leaf and rack faults); store-wide
    and cluster faults ignore it."""

    at_seconds: float
    fault_id: str
    node: int = 0


class Replication:
    """One replication's state. `simulate_once` is the usual entry; tests build one directly to
    inject scripted faults (`inject`) before `run`."""

    def __init__(self, p: SimParams, seed: np.random.SeedSequence) -> None:
        self.p = p
        # Children derived without mutating `seed` (SeedSequence.spawn counts its calls), so the
        # same seed object always gives the same streams.
        rngs = [np.random.default_rng(np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i)))
                for i in range(len(STREAMS))]
        (self.rng_clock, self.rng_kind, self.rng_domain, self.rng_pick, self.rng_repair,
         rng_lemon, self.rng_save, self.rng_measured) = rngs
        self.env = simpy.Environment()
        self.T = p.horizon_seconds
        self.clocks, self.domain_kinds = _clocks(p)
        self.kind_index = {k.fault_id: i for i, k in enumerate(p.kinds)}
        nk = len(p.kinds)
        n = p.total_nodes
        self.status = [JOB] * p.job_nodes + [WARM if p.spare_mode == "warm" else COLD] * p.spares
        self.version = [0] * n
        self.return_at = [0.0] * n
        self.failures = [0] * n
        # ladder attempts per node (times), for the attempt caps
        self.resets: defaultdict[int, list[float]] = defaultdict(list)
        self.reboots: defaultdict[int, list[float]] = defaultdict(list)
        self.history: defaultdict[int, dict[int, list[float]]] = defaultdict(dict)
        # Lemons: an exact share of nodes with a higher rate; the base rate is scaled so that the
        # fleet's mean stays the catalog's published rate. A replaced node is a new machine: it
        # gets the ordinary multiplier (`fresh_mult`) and no fault history.
        lemons = round(p.lemon_fraction * n)
        self.base_mult = np.ones(n)
        self.fresh_mult = 1.0
        if lemons and p.lemon_multiplier != 1.0:
            chosen = rng_lemon.choice(n, size=lemons, replace=False)
            self.base_mult[chosen] = p.lemon_multiplier
            mean = float(self.base_mult.mean())
            self.base_mult /= mean
            self.fresh_mult = 1.0 / mean
        self.job_size = p.job_nodes
        self.warm = [i for i in range(p.job_nodes, n) if self.status[i] == WARM][::-1]
        self.cold = [i for i in range(p.job_nodes, n) if self.status[i] == COLD][::-1]
        self.gamma = {c.shape: math.gamma(1.0 + 1.0 / c.shape) for c in self.clocks}
        # outputs
        self.run_start: list[float] = []
        self.run_end: list[float] = []
        self.run_cause: list[int] = []
        self.run_save_u: list[float] = []
        self.store_windows: list[tuple[float, float, int]] = []
        self.down_by_kind = np.zeros(nk)
        self.int_by_kind = np.zeros(nk, dtype=np.int64)
        self.faults_by_kind = np.zeros(nk, dtype=np.int64)
        self.node_down = 0.0
        self.planned_down = 0.0
        self.exhausted = False
        self.wait_nodes = 0.0
        self.breaker_trips = 0
        self.events = 0
        self.breaker_log: deque[tuple[float, int]] = deque()
        # as NVSentinel rounds it: ceil(nodes x whole percent / 100) (gpufleet.core.breaker)
        self.breaker_threshold = breaker_threshold(p.breaker_max_share, p.total_nodes)
        # job state. Recovery waits for EVERY pending deadline: the detect+isolate of each fault
        # that hit the job since it stopped (`ready_at`), the store or cluster coming back
        # (`blocked_until`) and the boot of every cold spare taken (`boot_until`); the restart itself
        # starts over after each new fault and is the longest one pending.
        self.running = True
        self.run_since = 0.0
        self.down_mark = 0.0
        self.down_kind = -1
        self.pending_kind = -1
        self.ready_at = 0.0
        self.blocked_until = 0.0
        self.boot_until = 0.0
        self.pending_restart = 0.0
        self.waiting = False  # for a repaired node (no spare left)
        self.node_back_pending = False
        self.wait_since = 0.0
        self.job_version = 0  # bumped at every disturbance: a wake-up of an older plan is stale
        self._arm_all(list(range(p.job_nodes)) + self.warm)
        if self.domain_kinds:
            self.env.process(self._domains())
        if p.upgrade is not None:
            self.env.process(self._upgrade())

    # ------------------------------------------------------------------ scripted faults

    def inject(self, faults: list[ScriptedFault]) -> None:
        for f in faults:
            if f.fault_id not in self.kind_index:
                raise ValueError(f"no fault kind {f.fault_id!r} in these parameters")
            k = self.kind_index[f.fault_id]
            ev = self.env.timeout(f.at_seconds)
            ev.callbacks.append(partial(self._on_script, k, f.node))

    def _on_script(self, k: int, node: int, _ev: Any) -> None:
        self.events += 1
        cls = self.p.kinds[k].fault_class
        if self.p.handling[cls].domain != "node" or cls in STORE_CLASSES:
            self._domain_fault(k, node)
        elif self.status[node] != DOWN:
            self._node_fault(node, k, None)

    # ------------------------------------------------------------------ node clocks

    def _mult(self, n: int) -> float:
        m = float(self.base_mult[n])
        if self.p.recurrence_factor != 1.0 and self.failures[n]:
            m *= self.p.recurrence_factor ** min(self.failures[n], self.p.recurrence_cap)
        return m

    def _draw(self, c: _Clock, mult: np.ndarray | float, size: int | None = None) -> Any:
        rate = c.rate_per_second * mult
        if c.shape == 1.0:
            return self.rng_clock.exponential(1.0, size) / rate
        return self.rng_clock.weibull(c.shape, size) / (rate * self.gamma[c.shape])

    def _arm_all(self, nodes: list[int]) -> None:
        if not nodes or not self.clocks:
            return
        if len(nodes) == 1:  # (a node back in service: scalar draws, the same numbers, 3x cheaper)
            for ci in range(len(self.clocks)):
                self._arm(nodes[0], ci)
            return
        idx = np.asarray(nodes)
        mult = self.base_mult[idx] if self.p.recurrence_factor == 1.0 else np.array(
            [self._mult(n) for n in nodes])
        for ci, c in enumerate(self.clocks):
            delays = self._draw(c, mult, len(nodes))
            for n, d in zip(nodes, delays.tolist(), strict=True):
                self._schedule(n, ci, d)

    def _arm(self, n: int, ci: int) -> None:
        self._schedule(n, ci, float(self._draw(self.clocks[ci], self._mult(n))))

    def _schedule(self, n: int, ci: int, delay: float) -> None:
        if self.env.now + delay >= self.T:
            return  # rings after the horizon: never scheduled
        ev = self.env.timeout(delay)
        ev.callbacks.append(partial(self._on_clock, n, ci, self.version[n]))

    def _on_clock(self, n: int, ci: int, version: int, _ev: Any) -> None:
        if version != self.version[n]:
            return
        self.events += 1
        c = self.clocks[ci]
        k = c.kinds[0] if len(c.kinds) == 1 else c.kinds[
            bisect.bisect_right(c.cumulative, self.rng_kind.random())]
        self._node_fault(n, k, ci)

    # ------------------------------------------------------------------ faults

    def _handling(self, k: int) -> tuple[float, float, float]:
        """(detect, isolate, restart floor) of one fault: fixed, or one measured game-day triple."""
        h = self.p.handling[self.p.kinds[k].fault_class]
        if h.measured:
            return h.measured[int(self.rng_measured.integers(len(h.measured)))]
        return h.detect_seconds, h.isolate_seconds, h.restart_floor_seconds

    def _node_fault(self, n: int, k: int, ci: int | None) -> None:
        p = self.p
        self.faults_by_kind[k] += 1
        was_job = self.status[n] == JOB
        action = self._ladder(n, k)
        detect, isolate, floor = self._handling(k)
        if action in _ISOLATES:
            if self._breaker_refuses(1):
                isolate = p.manual_seconds
            handle = detect + isolate
            if action is not LadderAction.REPLACE:  # (a replaced node was renewed by _ladder)
                self.failures[n] += 1
            human = p.manual_seconds if p.manual_remediation else 0.0  # (mode `cordon`)
            self._take_down(n, handle + human + self._outage(action))
        else:
            self.failures[n] += 1
            handle = detect
            if p.recurrence_factor != 1.0:  # its rate changed: redraw every clock (memoryless)
                self.version[n] += 1
                self._arm_all([n])
            elif ci is not None:
                self._arm(n, ci)
        if was_job:
            self._interrupt(k, handle, max(p.restart_seconds, floor))

    def _capped(self, attempts: list[float], cap: int) -> bool:
        """True when `cap` attempts are already counted (within the window, if the stack has one)."""
        w = self.p.attempt_window_seconds
        if w is not None:
            now = self.env.now
            attempts[:] = [t for t in attempts if t > now - w]
        if len(attempts) >= cap:
            return True
        attempts.append(self.env.now)
        return False

    def _ladder(self, n: int, k: int) -> LadderAction:
        """The rung for this fault on this node: catalog action, escalation on repeats, attempt caps."""
        p = self.p
        kind = p.kinds[k]
        action = kind.action
        if kind.escalate_repeats and kind.escalate_to and kind.escalate_window_hours:
            hist = self.history[n].setdefault(k, [])
            now = self.env.now
            hist.append(now)
            horizon = now - kind.escalate_window_hours * 3600.0
            hist[:] = [t for t in hist if t >= horizon]
            if len(hist) >= kind.escalate_repeats and _RANK[kind.escalate_to] > _RANK[action]:
                action = kind.escalate_to
        if action is LadderAction.RESET_GPU and self._capped(self.resets[n], p.cap_reset_gpu):
            action = LadderAction.REBOOT_NODE
        if action is LadderAction.REBOOT_NODE and self._capped(self.reboots[n], p.cap_reboot_node):
            action = LadderAction.REPLACE
        if action is LadderAction.REPLACE:
            self._new_machine(n)
        return action

    def _new_machine(self, n: int) -> None:
        """A replaced node is a new machine: the ordinary rate (no lemon multiplier, no recurrence)
        and no history for the attempt caps or escalation."""
        self.failures[n] = 0
        self.base_mult[n] = self.fresh_mult
        self.resets.pop(n, None)
        self.reboots.pop(n, None)
        self.history.pop(n, None)

    def _outage(self, action: LadderAction) -> float:
        p = self.p
        if action is LadderAction.RESET_GPU:
            return p.reset_gpu_seconds
        if action is LadderAction.REBOOT_NODE:
            return p.reboot_node_seconds
        u = self.rng_repair.random()
        acc = 0.0
        chosen = p.repair_bins[-1]
        for b in p.repair_bins:
            acc += b[0]
            if u < acc:
                chosen = b
                break
        _, lo, hi = chosen
        return float(3600.0 * lo * (hi / lo) ** self.rng_repair.random())

    def _breaker_refuses(self, count: int) -> bool:
        """NVSentinel's breaker: refuse to quarantine once the nodes quarantined within the window
        would pass its threshold (a leaf's nodes are one decision: all of them or none)."""
        now = self.env.now
        log = self.breaker_log
        while log and log[0][0] <= now - self.p.breaker_window_seconds:
            log.popleft()
        current = sum(c for _, c in log)
        if current + count > self.breaker_threshold:
            self.breaker_trips += 1
            return True
        log.append((now, count))
        return False

    def _take_down(self, n: int, duration: float) -> None:
        now = self.env.now
        back = now + duration
        st = self.status[n]
        if st == DOWN:
            if back <= self.return_at[n]:
                return
            self.node_down += min(back, self.T) - min(self.return_at[n], self.T)
        else:
            if st == JOB:
                self.job_size -= 1
            elif st == WARM:
                self.warm.remove(n)
            else:
                self.cold.remove(n)
            self.status[n] = DOWN
            self.node_down += min(back, self.T) - now
        self.version[n] += 1
        self.return_at[n] = back
        if back < self.T:
            ev = self.env.timeout(duration)
            ev.callbacks.append(partial(self._on_return, n, self.version[n]))

    def _on_return(self, n: int, version: int, _ev: Any) -> None:
        if version != self.version[n]:
            return
        self.events += 1
        if self.p.spare_mode == "warm":
            self.status[n] = WARM
            self.warm.append(n)
            self._arm_all([n])
        else:
            self.status[n] = COLD
            self.cold.append(n)
        if self.waiting and not self.node_back_pending:
            # The job takes it after every other event of this instant (as a SimPy process woken
            # by an event would): nodes that come back together are all there when it looks.
            self.node_back_pending = True
            ev = self.env.timeout(0.0)
            ev.callbacks.append(partial(self._on_node_back, self.job_version))

    def _on_node_back(self, version: int, _ev: Any) -> None:
        self.node_back_pending = False
        if version != self.job_version or not self.waiting:
            return
        self.wait_nodes += self.env.now - self.wait_since
        self.waiting = False
        self._advance()

    def _fleet_rate(self, k: int) -> float:
        """Fleet-level events per second of a domain kind. Store-wide faults happen to the one
        checkpoint store: their rate is the catalog's per-GPU rate times the size of the fleet it
        was observed on (`store_reference_gpus`), not times ours."""
        p = self.p
        kind = p.kinds[k]
        if kind.fault_class in STORE_CLASSES or p.handling[kind.fault_class].domain == "cluster":
            return kind.per_node_hour / p.gpus_per_node * p.store_reference_gpus / 3600.0
        return kind.per_node_hour * p.total_nodes / 3600.0

    def _domains(self) -> Generator[simpy.Event, Any, None]:
        """Correlated faults: fleet-level Poisson arrivals, each hitting one whole failure domain."""
        rates = [self._fleet_rate(k) for k in self.domain_kinds]
        total = sum(rates)
        cum = np.cumsum(rates) / total
        while True:
            delay = float(self.rng_domain.exponential(1.0 / total))
            if self.env.now + delay >= self.T:
                return
            yield self.env.timeout(delay)
            self.events += 1
            j = min(int(np.searchsorted(cum, self.rng_pick.random(), side="right")), len(rates) - 1)
            self._domain_fault(self.domain_kinds[j], None)

    def _domain_fault(self, k: int, node: int | None) -> None:
        p = self.p
        kind = p.kinds[k]
        h = p.handling[kind.fault_class]
        self.faults_by_kind[k] += 1
        detect, isolate, floor = self._handling(k)
        restart = max(p.restart_seconds, floor)
        outage = h.domain_outage_hours * 3600.0
        now = self.env.now
        state = STORE_CLASSES.get(kind.fault_class)
        if state is not None:
            # The checkpoint store, for the whole job: down -> saves fail and restores wait;
            # degraded -> both slower. The job only stops when the kind's action says so (a lost
            # mount kills its rank); otherwise it trains on, unprotected (accounting).
            self.store_windows.append((now, now + outage, state))
            if state == STORE_DOWN:
                self.blocked_until = max(self.blocked_until, now + outage)
                if not self.running:
                    self._disturb(None)  # a restore under way fails: wait for the store
            if kind.action is not LadderAction.NONE:
                self._interrupt(k, detect, restart)
            return
        if h.domain == "cluster":  # the whole cluster stops, no node is lost
            self.blocked_until = max(self.blocked_until, now + detect + outage)
            self._interrupt(k, detect, restart)
            return
        size = p.nodes_per_leaf if h.domain == "leaf" else p.nodes_per_rack
        pick = int(self.rng_pick.integers(p.total_nodes)) if node is None else node
        first = pick // size * size
        nodes = range(first, min(first + size, p.total_nodes))
        hit_job = any(self.status[n] == JOB for n in nodes)
        if self._breaker_refuses(len(nodes)):
            isolate = p.manual_seconds
        handle = detect + isolate
        for n in nodes:
            self._take_down(n, handle + outage)
        if hit_job:
            self._interrupt(k, handle, restart)

    # ------------------------------------------------------------------ planned drains

    def _upgrade(self) -> Generator[simpy.Event, Any, None]:
        """Rolling upgrade: waves of `wave_nodes` nodes not yet upgraded, spares first. A node that
        is already out (repairing) counts as upgraded when it comes back."""
        up = self.p.upgrade
        assert up is not None
        if up.start_seconds >= self.T:
            return
        yield self.env.timeout(up.start_seconds)
        todo = set(range(self.p.total_nodes))
        while todo:
            order = sorted(todo, key=lambda n: (self.status[n] == JOB, n))
            wave = order[:up.wave_nodes]
            todo.difference_update(wave)
            hits_job = False
            for n in wave:
                if self.status[n] == DOWN:
                    continue
                hits_job |= self.status[n] == JOB
                self._take_down(n, up.wave_seconds)
            self.events += 1
            if hits_job:  # the job checkpoints and restarts without these nodes
                self.pending_restart = max(self.pending_restart, self.p.restart_seconds)
                if self.running:
                    self.pending_kind = PLANNED
                self._disturb(PLANNED)
            if self.env.now + up.wave_seconds >= self.T:
                return
            yield self.env.timeout(up.wave_seconds)

    # ------------------------------------------------------------------ the job

    def _interrupt(self, k: int, handle: float, restart: float) -> None:
        self.int_by_kind[k] += 1
        self.pending_kind = k
        self.ready_at = max(self.ready_at, self.env.now + handle)
        self.pending_restart = max(self.pending_restart, restart)
        self._disturb(k)

    def _attribute_down(self) -> None:
        now = self.env.now
        if self.down_kind >= 0:
            self.down_by_kind[self.down_kind] += now - self.down_mark
        elif self.down_kind == PLANNED:
            self.planned_down += now - self.down_mark
        self.down_mark = now

    def _store_state(self, t: float) -> int | None:
        states = [s for a, b, s in self.store_windows if a <= t < b]
        return min(states) if states else None

    # The job is a small state machine driven by callbacks (no SimPy process: interrupts and
    # generators cost more than the model's own work): running, or down with a plan of what it
    # waits for next. Every disturbance (a fault on it, a planned drain, the store going down)
    # re-plans from the deadlines; a wake-up planned before the latest disturbance is stale.

    def _disturb(self, cause: int | None) -> None:
        """A fault that hits the job (cause = its kind), a planned drain (PLANNED), or the store
        going down while the job is down (None): stop, or start recovery over."""
        now = self.env.now
        self.events += 1
        if self.running:
            self.running = False
            self.run_start.append(self.run_since)
            self.run_end.append(now)
            self.run_cause.append(self.pending_kind)
            self.run_save_u.append(float(self.rng_save.random()))
            self.down_mark = now
            self.down_kind = self.pending_kind
        elif cause is not None:
            self._attribute_down()
            self.down_kind = self.pending_kind
        if self.waiting:
            self.wait_nodes += now - self.wait_since
            self.waiting = False
        self.node_back_pending = False  # (a node-back call planned before is stale now)
        self._advance()

    def _advance(self) -> None:
        """Plan the recovery's next step: wait for every deadline, take the replacements (all at
        once, so cold spares boot side by side) or wait for a repaired node, wait for the boots,
        then restart (the longest restart pending; a disturbance starts it over)."""
        env = self.env
        p = self.p
        now = env.now
        self.job_version += 1
        t = max(self.ready_at, self.blocked_until)
        if t > now:
            self._wake(t - now, False)
            return
        while self.job_size < p.job_nodes and (self.warm or self.cold):
            if self.warm:
                n = self.warm.pop()
            else:
                n = self.cold.pop()
                self._arm_all([n])  # powered on: it can fail from now
                self.boot_until = max(self.boot_until, now + p.cold_start_seconds)
            self.status[n] = JOB
            self.job_size += 1
        if self.job_size < p.job_nodes:  # no spare left: wait for a repaired node (_on_return)
            self.exhausted = True
            self.waiting = True
            self.wait_since = now
            return
        if self.boot_until > now:  # the last cold spare taken is still booting
            self._wake(self.boot_until - now, False)
            return
        restart = self.pending_restart
        if self._store_state(now) == STORE_DEGRADED:
            restart += p.checkpoint_load_seconds * (p.store_degraded_factor - 1.0)
        self._wake(restart, True)

    def _wake(self, delay: float, restarted: bool) -> None:
        ev = self.env.timeout(delay)
        ev.callbacks.append(partial(self._on_wake, self.job_version, restarted))

    def _on_wake(self, version: int, restarted: bool, _ev: Any) -> None:
        if version != self.job_version:
            return
        if not restarted:
            self._advance()
            return
        self._attribute_down()
        self.down_kind = -1
        self.pending_restart = 0.0
        self.running = True
        self.run_since = self.env.now

    # ------------------------------------------------------------------ run

    def run(self) -> ReplicationResult:
        self.env.run(until=self.T)
        if self.running:
            self.run_start.append(self.run_since)
            self.run_end.append(self.T)
            self.run_cause.append(-1)
            self.run_save_u.append(float(self.rng_save.random()))
        else:
            self._attribute_down()
            if self.waiting:
                self.wait_nodes += self.T - self.wait_since
        w = self.store_windows
        return ReplicationResult(
            horizon_seconds=self.T,
            run_start=np.asarray(self.run_start, dtype=float),
            run_end=np.asarray(self.run_end, dtype=float),
            run_cause=np.asarray(self.run_cause, dtype=np.int64),
            down_seconds_by_kind=self.down_by_kind,
            interruptions_by_kind=self.int_by_kind,
            faults_by_kind=self.faults_by_kind,
            node_down_seconds=self.node_down,
            total_nodes=self.p.total_nodes,
            spares_exhausted=self.exhausted,
            wait_for_nodes_seconds=self.wait_nodes,
            breaker_trips=self.breaker_trips,
            events=self.events,
            run_save_u=np.asarray(self.run_save_u, dtype=float),
            store_start=np.asarray([a for a, _, _ in w], dtype=float),
            store_end=np.asarray([min(b, self.T) for _, b, _ in w], dtype=float),
            store_state=np.asarray([s for _, _, s in w], dtype=np.int64),
            planned_down_seconds=self.planned_down,
        )


_Model = Replication  # the former private name

def simulate_once(p: SimParams, seed: np.random.SeedSequence,
                  faults: list[ScriptedFault] | None = None) -> ReplicationResult:
    """Run one replication with its own seed sequence (children spawned per random stream), plus
    any scripted faults."""
    r = Replication(p, seed)
    if faults:
        r.inject(faults)
    return r.run()
