"""Pure arithmetic on a replication's running periods: saved work, checkpoint overhead, lost work.

A running job alternates `interval` seconds of training with a blocking checkpoint write of
`write` seconds. A fault loses everything since the last completed write (training and any partial
write); at the horizon the unsaved training is counted as progress (the job is still running).
Because faults do not depend on the checkpoint policy, one simulated trajectory gives the ETTR of
every (interval, write) pair: sweeps over the interval reuse the same replications.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Accounting:
    """Seconds of the horizon, split four ways (they sum to the horizon)."""

    useful: float
    checkpoint_overhead: float
    lost_work_by_kind: np.ndarray
    down_by_kind: np.ndarray
    planned_down: float = 0.0  # job stopped for planned drains

    @property
    def lost_work(self) -> float:
        return float(self.lost_work_by_kind.sum())

    @property
    def down(self) -> float:
        return float(self.down_by_kind.sum()) + self.planned_down


def _kept_cycles(done: np.ndarray, save_u: np.ndarray | None, fail_prob: float) -> np.ndarray:
    """Completed saves that still count at a fault: each save fails on its own with `fail_prob`, and
    only the trailing run of failures matters (an earlier failed save is covered by the next good
    one). P(the last j saves all failed) = q^j, so that run is floor(ln u / ln q) for a uniform u."""
    if save_u is None or fail_prob <= 0.0:
        return done
    if fail_prob >= 1.0:
        return np.zeros_like(done)
    u = np.clip(save_u, 1e-300, 1.0)
    trailing = np.floor(np.log(u) / math.log(fail_prob))
    kept: np.ndarray = np.maximum(done - trailing, 0.0)
    return kept


def save_costs(write: float, fail_prob: float, retries: int) -> tuple[float, float]:
    """(write seconds per save, probability a save fails in the end) when a save that fails on its
    own is retried at once up to `retries` times: it fails in the end with q^(k+1), and costs
    w x (1 + q + ... + q^k) on average. Every save is charged that mean (D), so cycles stay of equal
    length; the retries' spread is left out (second order while w << the interval)."""
    if retries <= 0 or fail_prob <= 0.0:
        return write, fail_prob
    if fail_prob >= 1.0:
        return write * (retries + 1), 1.0
    attempts = -math.expm1((retries + 1) * math.log(fail_prob)) / (1.0 - fail_prob)
    return write * attempts, fail_prob ** (retries + 1)


@dataclass(frozen=True)
class StoreWindows:
    """The checkpoint store's bad spells: [start, end) with state 0 = down (saves fail), 1 =
    degraded (saves take `factor` times longer)."""

    start: np.ndarray
    end: np.ndarray
    state: np.ndarray
    factor: float

    def state_at(self, t: float) -> int | None:
        on = (self.start <= t) & (t < self.end)
        return int(self.state[on].min()) if on.any() else None

    def next_boundary(self, t: float) -> float:
        b = np.concatenate([self.start, self.end])
        later = b[b > t]
        return float(later.min()) if later.size else math.inf


def _walk(s: float, e: float, horizon: bool, u: float, interval: float, write: float,
          fail_prob: float, store: StoreWindows) -> tuple[float, float, float]:
    """(useful, overhead, lost) of one running period that meets a store window, cycle by cycle
    (in runs of identical cycles): a save that starts while the store is down fails, and so does
    one still writing when the store goes down; one that starts while it is degraded takes
    `factor` x longer."""
    t = s
    train = over = 0.0
    good: list[tuple[float, float, float, int, float, float]] = []  # runs of good saves
    while True:
        save_at = t + interval
        if save_at > e:
            break
        state = store.state_at(save_at)
        w = write * (store.factor if state == 1 else 1.0)
        cyc = interval + w
        nxt = store.next_boundary(save_at)
        m1 = math.inf if nxt == math.inf else math.ceil((nxt - save_at) / cyc)
        m = int(min(m1, math.floor((e - t) / cyc)))
        if m <= 0:
            break  # the save is cut off by the end of the period
        # The run's last save may still be writing when the store goes down: it is cut off (fails).
        cut = int(m == m1 and state != 0 and w > 0 and store.state_at(nxt) == 0
                  and save_at + (m - 1) * cyc + w > nxt)
        if state != 0 and m - cut > 0:
            good.append((t, cyc, interval, m - cut, train, over))
        t += m * cyc
        train += m * interval
        over += m * w
    if horizon:  # still running (or drained at a checkpoint): nothing is lost
        rem = e - t
        part = min(rem, interval)
        return train + part, over + rem - part, 0.0
    drop = 0.0
    if fail_prob >= 1.0:
        drop = math.inf
    elif fail_prob > 0.0:
        drop = math.floor(math.log(max(u, 1e-300)) / math.log(fail_prob))
    while good and drop > 0:  # the last `drop` good saves failed on their own
        t0, cyc, dt, m, tr0, ov0 = good[-1]
        if drop >= m:
            good.pop()
            drop -= m
        else:
            good[-1] = (t0, cyc, dt, m - int(drop), tr0, ov0)
            drop = 0
    if not good:
        return 0.0, 0.0, e - s
    t0, cyc, dt, m, tr0, ov0 = good[-1]
    saved_at = t0 + m * cyc
    return tr0 + m * dt, ov0 + m * (cyc - dt), e - saved_at


def account(
    start: np.ndarray,
    end: np.ndarray,
    cause: np.ndarray,
    down_by_kind: np.ndarray,
    interval: float,
    write: float,
    *,
    save_u: np.ndarray | None = None,
    fail_prob: float = 0.0,
    store: StoreWindows | None = None,
) -> Accounting:
    """Split the running periods into saved work, write overhead and lost work (by the fault kind
    that ended the period).

    A period ended by a fault (cause >= 0) loses everything since its last good save: a save cut
    off by the fault, saves that failed on their own (`fail_prob`, one uniform per period in
    `save_u`), and saves attempted while the checkpoint store was down (`store`). A period that
    reaches the horizon (-1) or a planned drain (-2, checkpointed first) loses nothing."""
    if interval <= 0 or write < 0:
        raise ValueError("checkpoint interval must be > 0 and write time >= 0")
    length = end - start
    cycle = interval + write
    done = np.floor(length / cycle)
    rem = length - done * cycle
    at_horizon = cause < 0
    kept = np.where(at_horizon, done, _kept_cycles(done, save_u, fail_prob))
    lost_len = np.where(at_horizon, 0.0, length - kept * cycle)
    useful = kept * interval + np.where(at_horizon, np.minimum(rem, interval), 0.0)
    overhead = kept * write + np.where(at_horizon, np.maximum(rem - interval, 0.0), 0.0)
    if store is not None and store.start.size:
        # Periods that meet a store window (few): walk them cycle by cycle.
        for i in np.nonzero([bool(np.any((store.start < e) & (store.end > s)))
                             for s, e in zip(start.tolist(), end.tolist(), strict=True)])[0]:
            u = float(save_u[i]) if save_u is not None else 1.0
            useful[i], overhead[i], lost_len[i] = _walk(
                float(start[i]), float(end[i]), bool(at_horizon[i]), u, interval, write, fail_prob, store)
    lost = np.bincount(
        cause[~at_horizon], weights=lost_len[~at_horizon], minlength=len(down_by_kind)
    ).astype(float)
    return Accounting(float(useful.sum()), float(overhead.sum()), lost, down_by_kind)


def ettr_closed_form(nodes: int, rate_per_node_second: float, restart: float, interval: float,
                     write: float) -> float:
    """Kokolis et al. (HPCA 2025, S): E[ETTR] ~= (1 - N r (u0 + dt/2)) / (1 + w/dt).

    A first-order approximation: good when N r (u0 + dt) << 1."""
    nr = nodes * rate_per_node_second
    return (1.0 - nr * (restart + interval / 2.0)) / (1.0 + write / interval)


def ettr_renewal(nodes: int, rate_per_node_second: float, restart: float, interval: float,
                 write: float) -> float:
    """The exact long-run ETTR of the same model (D: renewal-reward argument), for checking the
    approximation: faults at rate L = N r also during recovery (which then starts over), so
    E[recovery] = (e^{L u0} - 1)/L and E[saved work per run] = dt e^{-Lc}/(1 - e^{-Lc}), c = dt + w:
    ETTR = L dt e^{-L (c + u0)} / (1 - e^{-L c})."""
    lam = nodes * rate_per_node_second
    c = interval + write
    return lam * interval * math.exp(-lam * (c + restart)) / -math.expm1(-lam * c)


def ettr_mixed_handling(nodes: int, rate_per_node_second: float, handles: Sequence[float],
                        shares: Sequence[float], restart: float, interval: float, write: float,
                        *, waits_for: str = "every") -> float:
    """The exact long-run ETTR when faults differ in how long they take to handle (D: renewal
    reward, as `ettr_renewal`). Fault i (share p_i) is ready after `handles[i]`; the restart (R)
    starts when nothing is pending and starts over after a fault.

    `waits_for="every"` (the model): each fault covers [t, t + D + R]; a down period is a busy
    period of an M/G/inf queue with service S = D + R, so E[down] = (e^{L E[S]} - 1)/L (Takacs)
    and ETTR = ettr_renewal with u0 = E[S]. `waits_for="latest"` (the model before issue 18):
    each fault replaces the pending wait by its own S, so a down period ends after the first S
    with no fault in it: E[down] = (1/m - 1)/L with m = E[e^{-L S}]. By Jensen's inequality the
    latest-only model never waits longer, which is the optimism the issue describes."""
    if len(handles) != len(shares) or abs(sum(shares) - 1.0) > 1e-9:
        raise ValueError("one share per handling time, summing to 1")
    lam = nodes * rate_per_node_second
    c = interval + write
    saved_rate = lam * interval * math.exp(-lam * c) / -math.expm1(-lam * c)  # E[saved] / E[up]
    if waits_for == "every":
        mean_s = sum(p * (d + restart) for d, p in zip(handles, shares, strict=True))
        return saved_rate * math.exp(-lam * mean_s)
    if waits_for == "latest":
        m = sum(p * math.exp(-lam * (d + restart)) for d, p in zip(handles, shares, strict=True))
        return saved_rate * m
    raise ValueError("waits_for is 'every' or 'latest'")
