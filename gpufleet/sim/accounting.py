"""Pure arithmetic on a replication's running periods: saved work, checkpoint overhead, lost work.

A running job alternates `interval` seconds of training with a blocking checkpoint write of
`write` seconds. A fault loses everything since the last completed write (training and any partial
write); at the horizon the unsaved training is counted as progress (the job is still running).
Because faults do not depend on the checkpoint policy, one simulated trajectory gives the ETTR of
every (interval, write) pair: sweeps over the interval reuse the same replications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Accounting:
    """Seconds of the horizon, split four ways (they sum to the horizon)."""

    useful: float
    checkpoint_overhead: float
    lost_work_by_kind: np.ndarray
    down_by_kind: np.ndarray

    @property
    def lost_work(self) -> float:
        return float(self.lost_work_by_kind.sum())

    @property
    def down(self) -> float:
        return float(self.down_by_kind.sum())


def account(
    start: np.ndarray,
    end: np.ndarray,
    cause: np.ndarray,
    down_by_kind: np.ndarray,
    interval: float,
    write: float,
) -> Accounting:
    """Split the running periods into saved work, write overhead and lost work (by the fault kind
    that ended the period)."""
    if interval <= 0 or write < 0:
        raise ValueError("checkpoint interval must be > 0 and write time >= 0")
    length = end - start
    cycle = interval + write
    done = np.floor(length / cycle)
    rem = length - done * cycle
    at_horizon = cause < 0
    useful = done * interval + np.where(at_horizon, np.minimum(rem, interval), 0.0)
    overhead = done * write + np.where(at_horizon, np.maximum(rem - interval, 0.0), 0.0)
    lost = np.bincount(
        cause[~at_horizon], weights=rem[~at_horizon], minlength=len(down_by_kind)
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
