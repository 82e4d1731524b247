"""One Monte Carlo replication: the cluster, its faults and one large training job (SimPy).

Design for speed (benchmarks/simulate.py): there is no SimPy process per node. Each powered node
carries one clock per arrival law (one exponential clock for all its exponential fault classes,
one per Weibull class), scheduled as a bare SimPy timeout with a callback; a clock that would ring
after the horizon is never scheduled, so a replication costs about one event per fault. Clocks are
renewed when a node (re)enters service, and invalidated by a per-node version number when it leaves.
Correlated faults (a leaf switch, the storage back-end) come from one fleet-level process.

Checkpoints are not events: the job's running periods are recorded and the work they saved is
computed afterwards (`gpufleet.sim.accounting`) for any checkpoint interval and write cost, because
the fault process does not depend on them. One random stream per stochastic process (STYLE.md 11).
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import simpy

from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sim.params import SimParams

JOB, WARM, COLD, DOWN = 0, 1, 2, 3

STREAMS = ("node-clocks", "fault-kind", "domain-clocks", "domain-pick", "repair", "lemons")


@dataclass(frozen=True)
class ReplicationResult:
    """What one replication observed; every metric is derived from these."""

    horizon_seconds: float
    run_start: np.ndarray  # the job's running periods
    run_end: np.ndarray
    run_cause: np.ndarray  # kind index that ended the period; -1 = the horizon
    down_seconds_by_kind: np.ndarray  # job not running (detect, isolate, wait, restart), by kind
    interruptions_by_kind: np.ndarray  # faults that hit the job, by kind
    faults_by_kind: np.ndarray  # every fault in the fleet, by kind
    node_down_seconds: float  # node-seconds out of service (isolated, repairing, domain down)
    total_nodes: int
    spares_exhausted: bool  # the job needed a node and no spare was left
    wait_for_nodes_seconds: float
    breaker_trips: int
    events: int

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
        if h.domain != "node":
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


class _Model:
    def __init__(self, p: SimParams, seed: np.random.SeedSequence) -> None:
        self.p = p
        # Children derived without mutating `seed` (SeedSequence.spawn counts its calls), so the
        # same seed object always gives the same streams.
        rngs = [np.random.default_rng(np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i)))
                for i in range(len(STREAMS))]
        (self.rng_clock, self.rng_kind, self.rng_domain, self.rng_pick, self.rng_repair,
         rng_lemon) = rngs
        self.env = simpy.Environment()
        self.T = p.horizon_seconds
        self.clocks, self.domain_kinds = _clocks(p)
        nk = len(p.kinds)
        n = p.total_nodes
        self.status = [JOB] * p.job_nodes + [WARM if p.spare_mode == "warm" else COLD] * p.spares
        self.version = [0] * n
        self.return_at = [0.0] * n
        self.failures = [0] * n
        self.resets = [0] * n
        self.reboots = [0] * n
        self.history: dict[tuple[int, int], list[float]] = {}
        # Lemons: an exact share of nodes with a higher rate; the base rate is scaled so that the
        # fleet's mean stays the catalog's published rate.
        lemons = round(p.lemon_fraction * n)
        self.base_mult = np.ones(n)
        if lemons and p.lemon_multiplier != 1.0:
            chosen = rng_lemon.choice(n, size=lemons, replace=False)
            self.base_mult[chosen] = p.lemon_multiplier
            self.base_mult /= self.base_mult.mean()
        self.job_size = p.job_nodes
        self.warm = [i for i in range(p.job_nodes, n) if self.status[i] == WARM][::-1]
        self.cold = [i for i in range(p.job_nodes, n) if self.status[i] == COLD][::-1]
        self.gamma = {c.shape: math.gamma(1.0 + 1.0 / c.shape) for c in self.clocks}
        # outputs
        self.run_start: list[float] = []
        self.run_end: list[float] = []
        self.run_cause: list[int] = []
        self.down_by_kind = np.zeros(nk)
        self.int_by_kind = np.zeros(nk, dtype=np.int64)
        self.faults_by_kind = np.zeros(nk, dtype=np.int64)
        self.node_down = 0.0
        self.exhausted = False
        self.wait_nodes = 0.0
        self.breaker_trips = 0
        self.events = 0
        self.breaker_log: deque[tuple[float, int]] = deque()
        # job state
        self.running = True
        self.run_since = 0.0
        self.down_mark = 0.0
        self.down_kind = -1
        self.pending_kind = -1
        self.pending_handle = 0.0
        self.pending_restart = 0.0
        self.storage_back = 0.0
        self.waiting: simpy.Event | None = None
        self.wait_since = 0.0
        self._arm_all(list(range(p.job_nodes)) + self.warm)
        self.job = self.env.process(self._job())
        if self.domain_kinds:
            self.env.process(self._domains())

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
        if not nodes:
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

    def _node_fault(self, n: int, k: int, ci: int) -> None:
        p = self.p
        kind = p.kinds[k]
        h = p.handling[kind.fault_class]
        self.faults_by_kind[k] += 1
        was_job = self.status[n] == JOB
        action = self._ladder(n, k)
        self.failures[n] += 1
        if action.isolates_node:
            isolate = h.isolate_seconds
            if self._breaker_refuses(1):
                isolate = p.manual_seconds
            handle = h.detect_seconds + isolate
            self._take_down(n, handle + self._outage(action))
        else:
            handle = h.detect_seconds
            if p.recurrence_factor != 1.0:  # its rate changed: redraw every clock (memoryless)
                self.version[n] += 1
                self._arm_all([n])
            else:
                self._arm(n, ci)
        if was_job:
            self._interrupt(k, handle, max(p.restart_seconds, h.restart_floor_seconds))

    def _ladder(self, n: int, k: int) -> LadderAction:
        """The rung for this fault on this node: catalog action, escalation on repeats, attempt caps."""
        p = self.p
        kind = p.kinds[k]
        action = kind.action
        if kind.escalate_repeats and kind.escalate_to and kind.escalate_window_hours:
            hist = self.history.setdefault((n, k), [])
            now = self.env.now
            hist.append(now)
            horizon = now - kind.escalate_window_hours * 3600.0
            hist[:] = [t for t in hist if t >= horizon]
            if len(hist) >= kind.escalate_repeats and kind.escalate_to.rank > action.rank:
                action = kind.escalate_to
        if action is LadderAction.RESET_GPU:
            if self.resets[n] >= p.cap_reset_gpu:
                action = LadderAction.REBOOT_NODE
            else:
                self.resets[n] += 1
        if action is LadderAction.REBOOT_NODE:
            if self.reboots[n] >= p.cap_reboot_node:
                action = LadderAction.REPLACE
            else:
                self.reboots[n] += 1
        if action is LadderAction.REPLACE:
            self.resets[n] = self.reboots[n] = 0
        return action

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
        """NVSentinel-style breaker: refuse to quarantine past a share of the fleet in a window."""
        now = self.env.now
        log = self.breaker_log
        while log and log[0][0] <= now - self.p.breaker_window_seconds:
            log.popleft()
        current = sum(c for _, c in log)
        if current + count > self.p.breaker_max_share * self.p.total_nodes:
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
        if self.waiting is not None and not self.waiting.triggered:
            self.waiting.succeed()

    def _domains(self) -> Generator[simpy.Event, Any, None]:
        """Correlated faults: fleet-level Poisson arrivals, each hitting one whole failure domain."""
        p = self.p
        rates = [p.kinds[k].per_node_hour * p.total_nodes / 3600.0 for k in self.domain_kinds]
        total = sum(rates)
        cum = np.cumsum(rates) / total
        while True:
            delay = float(self.rng_domain.exponential(1.0 / total))
            if self.env.now + delay >= self.T:
                return
            yield self.env.timeout(delay)
            self.events += 1
            j = min(int(np.searchsorted(cum, self.rng_pick.random(), side="right")), len(rates) - 1)
            self._domain_fault(self.domain_kinds[j])

    def _domain_fault(self, k: int) -> None:
        p = self.p
        kind = p.kinds[k]
        h = p.handling[kind.fault_class]
        self.faults_by_kind[k] += 1
        restart = max(p.restart_seconds, h.restart_floor_seconds)
        outage = h.domain_outage_hours * 3600.0
        if h.domain == "cluster":  # e.g. checkpoint storage: the job stops, no node is lost
            self.storage_back = max(self.storage_back, self.env.now + h.detect_seconds + outage)
            self._interrupt(k, h.detect_seconds, restart)
            return
        size = p.nodes_per_leaf if h.domain == "leaf" else p.nodes_per_rack
        first = int(self.rng_pick.integers(p.total_nodes)) // size * size
        nodes = range(first, min(first + size, p.total_nodes))
        hit_job = any(self.status[n] == JOB for n in nodes)
        isolate = p.manual_seconds if self._breaker_refuses(len(nodes)) else h.isolate_seconds
        handle = h.detect_seconds + isolate
        for n in nodes:
            self._take_down(n, handle + outage)
        if hit_job:
            self._interrupt(k, handle, restart)

    # ------------------------------------------------------------------ the job

    def _interrupt(self, k: int, handle: float, restart: float) -> None:
        self.int_by_kind[k] += 1
        self.pending_kind = k
        self.pending_handle = handle
        self.pending_restart = restart
        self.job.interrupt(k)

    def _attribute_down(self) -> None:
        now = self.env.now
        if self.down_kind >= 0:
            self.down_by_kind[self.down_kind] += now - self.down_mark
        self.down_mark = now

    def _job(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        p = self.p
        while True:
            self.running = True
            self.run_since = env.now
            with contextlib.suppress(simpy.Interrupt):
                yield env.event()  # runs until a fault interrupts it
            self.running = False
            self.run_start.append(self.run_since)
            self.run_end.append(env.now)
            self.run_cause.append(self.pending_kind)
            self.down_mark = env.now
            self.down_kind = self.pending_kind
            while True:
                try:
                    self.events += 1
                    yield env.timeout(self.pending_handle)  # detect + isolate
                    if self.storage_back > env.now:
                        yield env.timeout(self.storage_back - env.now)
                    boot = False
                    while self.job_size < p.job_nodes:
                        if self.warm:
                            n = self.warm.pop()
                        elif self.cold:
                            n = self.cold.pop()
                            boot = True
                            self._arm_all([n])  # powered on: it can fail from now
                        else:
                            self.exhausted = True
                            self.waiting = env.event()
                            self.wait_since = env.now
                            try:
                                yield self.waiting
                            finally:
                                self.wait_nodes += env.now - self.wait_since
                                self.waiting = None
                            continue
                        self.status[n] = JOB
                        self.job_size += 1
                    if boot:
                        yield env.timeout(p.cold_start_seconds)
                    yield env.timeout(self.pending_restart)
                    break
                except simpy.Interrupt:
                    self._attribute_down()
                    self.down_kind = self.pending_kind
            self._attribute_down()
            self.down_kind = -1

    # ------------------------------------------------------------------ run

    def run(self) -> ReplicationResult:
        self.env.run(until=self.T)
        if self.running:
            self.run_start.append(self.run_since)
            self.run_end.append(self.T)
            self.run_cause.append(-1)
        else:
            self._attribute_down()
            if self.waiting is not None:
                self.wait_nodes += self.T - self.wait_since
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
        )


def simulate_once(p: SimParams, seed: np.random.SeedSequence) -> ReplicationResult:
    """Run one replication with its own seed sequence (children spawned per random stream)."""
    return _Model(p, seed).run()
