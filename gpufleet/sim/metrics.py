"""Metrics over replications, each with a 95% confidence interval (pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.sim.accounting import Accounting, StoreWindows, account, save_costs
from gpufleet.sim.engine import ReplicationResult
from gpufleet.sim.params import SimParams
from gpufleet.sim.stats import Estimate, mean_ci, proportion_ci

CHECKPOINT_CAUSE = "checkpoint writes"
PLANNED_CAUSE = "planned drains (upgrade waves)"


@dataclass(frozen=True)
class Metrics:
    ettr: Estimate
    interruptions: Estimate  # per replication (the whole horizon)
    interruptions_per_day: Estimate
    mtbf_hours: Estimate  # job mean time between interruptions
    node_availability: Estimate
    job_capacity_availability: Estimate  # share of time the job was not waiting for nodes
    spares_exhausted: Estimate  # probability over replications
    breaker_trips: Estimate
    lost_gpu_hours_by_cause: dict[str, Estimate]
    events_per_run: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "ettr": self.ettr.as_dict(),
            "interruptions": self.interruptions.as_dict(),
            "interruptions_per_day": self.interruptions_per_day.as_dict(),
            "mtbf_hours": self.mtbf_hours.as_dict(),
            "node_availability": self.node_availability.as_dict(),
            "job_capacity_availability": self.job_capacity_availability.as_dict(),
            "p_spares_exhausted": self.spares_exhausted.as_dict(),
            "breaker_trips": self.breaker_trips.as_dict(),
            "lost_gpu_hours_by_cause": {k: v.as_dict() for k, v in self.lost_gpu_hours_by_cause.items()},
            "events_per_run": self.events_per_run,
        }


def accounts(p: SimParams, results: Sequence[ReplicationResult], interval: float | None = None,
             write: float | None = None) -> list[Accounting]:
    dt = p.checkpoint_interval_seconds if interval is None else interval
    w = p.checkpoint_write_seconds if write is None else write
    return [account_result(p, r, dt, w) for r in results]


def account_result(p: SimParams, r: ReplicationResult, interval: float, write: float) -> Accounting:
    """One replication's accounting at a checkpoint interval and write cost, with its failed saves,
    store windows and planned drains."""
    store = (StoreWindows(r.store_start, r.store_end, r.store_state, p.store_degraded_factor)
             if r.store_start.size else None)
    w, q = save_costs(write, p.checkpoint_failure_probability, p.checkpoint_retries)
    a = account(r.run_start, r.run_end, r.run_cause, r.down_seconds_by_kind, interval, w,
                save_u=r.run_save_u if r.run_save_u.size else None, fail_prob=q, store=store)
    return dataclasses.replace(a, planned_down=r.planned_down_seconds)


def ettr_values(p: SimParams, results: Sequence[ReplicationResult], interval: float | None = None,
                write: float | None = None) -> np.ndarray:
    return np.array([a.useful / p.horizon_seconds for a in accounts(p, results, interval, write)])


def summarize(p: SimParams, results: Sequence[ReplicationResult]) -> Metrics:
    if not results:
        raise ValueError("no replications")
    T = p.horizon_seconds
    acc = accounts(p, results)
    ettr = mean_ci([a.useful / T for a in acc], 0.0, 1.0)
    ints = np.array([r.interruptions for r in results], dtype=float)
    inter = mean_ci(ints, 0.0)
    per_day = mean_ci(ints / p.days, 0.0)
    hours = T / 3600.0
    # MTBF = horizon / mean interruptions; its interval is the interruptions' interval mapped through.
    mtbf = Estimate(
        hours / inter.mean if inter.mean > 0 else float("inf"),
        hours / inter.high if inter.high > 0 else float("inf"),
        hours / inter.low if inter.low > 0 else float("inf"),
        inter.n,
    )
    avail = mean_ci([1.0 - r.node_down_seconds / (r.total_nodes * T) for r in results], 0.0, 1.0)
    cap = mean_ci([1.0 - r.wait_for_nodes_seconds / T for r in results], 0.0, 1.0)
    exhausted = proportion_ci(sum(r.spares_exhausted for r in results), len(results))
    trips = mean_ci([float(r.breaker_trips) for r in results], 0.0)
    causes = sorted({k.cause for k in p.kinds})
    index = {c: i for i, c in enumerate(causes)}
    kind_to_cause = np.array([index[k.cause] for k in p.kinds], dtype=np.int64)
    gpu_h = p.job_gpus / 3600.0
    per_cause = np.zeros((len(results), len(causes)))
    for j, a in enumerate(acc):
        per_cause[j] = np.bincount(kind_to_cause, weights=a.lost_work_by_kind + a.down_by_kind,
                                   minlength=len(causes)) * gpu_h
    # (lost hours are never negative: the intervals are clipped at 0, as shares are at [0, 1])
    lost = {c: mean_ci(per_cause[:, i], 0.0) for c, i in index.items()}
    lost[CHECKPOINT_CAUSE] = mean_ci([a.checkpoint_overhead * gpu_h for a in acc], 0.0)
    if p.upgrade is not None:
        lost[PLANNED_CAUSE] = mean_ci([a.planned_down * gpu_h for a in acc], 0.0)
    lost = dict(sorted(lost.items(), key=lambda kv: -kv[1].mean))
    return Metrics(ettr, inter, per_day, mtbf, avail, cap, exhausted, trips, lost,
                   float(np.mean([r.events for r in results])))
