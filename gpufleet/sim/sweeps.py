"""ETTR as a function of the checkpoint interval and of the spare count."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from gpufleet.sim.engine import ReplicationResult
from gpufleet.sim.metrics import ettr_values, summarize
from gpufleet.sim.params import SimParams
from gpufleet.sim.runner import run_replications
from gpufleet.sim.stats import Estimate, mean_ci

INTERVALS_MINUTES = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0)


@dataclass(frozen=True)
class Point:
    x: float
    ettr: Estimate
    capacity: Estimate | None = None  # job capacity availability (spare sweeps)
    p_exhausted: Estimate | None = None
    # Not simulated: at spare count `derived_from` no replication ever ran out of spares, so more
    # spares leave the job's trajectory the same in distribution; its estimates are repeated.
    derived_from: float | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"x": self.x, "ettr": self.ettr.as_dict()}
        if self.derived_from is not None:
            out["derived_from"] = self.derived_from
        if self.capacity is not None:
            out["job_capacity_availability"] = self.capacity.as_dict()
        if self.p_exhausted is not None:
            out["p_spares_exhausted"] = self.p_exhausted.as_dict()
        return out


def ettr_vs_interval(
    p: SimParams, results: Sequence[ReplicationResult], minutes: Sequence[float] = INTERVALS_MINUTES
) -> list[Point]:
    """Same replications, re-accounted per interval (faults do not depend on the interval)."""
    return [Point(m, mean_ci(ettr_values(p, results, interval=m * 60.0), 0.0, 1.0)) for m in minutes]


def spare_grid(p: SimParams) -> list[int]:
    """0 and powers of two from about 0.1% of the job's nodes up to ~8% of them, plus the stack's
    own count and, when a leaf switch can fail, one leaf's worth of nodes (a leaf outage takes them
    all at once)."""
    top = max(8, int(0.08 * p.job_nodes), 2 * p.spares)
    grid = {0, p.spares}
    if any(p.handling[k.fault_class].domain == "leaf" and k.per_node_hour > 0 for k in p.kinds):
        grid.add(p.nodes_per_leaf)
    s = 1
    while 2 * s <= p.job_nodes // 1000:  # 1, 2, 4 spares of 16,384 nodes tell nothing new
        s *= 2
    while s <= top:
        grid.add(s)
        s *= 2
    return sorted(g for g in grid if g < p.job_nodes)


def ettr_vs_spares(
    p: SimParams, seed: int, runs: int, spares: Sequence[int], workers: int | None = None
) -> dict[int, list[ReplicationResult]]:
    """Replications per spare count, all with the same seed (common random numbers)."""
    return {s: run_replications(p.with_changes(spares=s), seed, runs, workers) for s in spares}


def spare_points(p: SimParams, by_spares: dict[int, list[ReplicationResult]]) -> list[Point]:
    out = []
    for s, results in sorted(by_spares.items()):
        m = summarize(p.with_changes(spares=s), results)
        out.append(Point(float(s), m.ettr, m.job_capacity_availability, m.spares_exhausted))
    return out


def spare_sweep(
    p: SimParams,
    seed: int,
    runs: int,
    spares: Sequence[int],
    workers: int | None = None,
    *,
    pool: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
    reuse: dict[int, list[ReplicationResult]] | None = None,
) -> tuple[list[Point], dict[int, list[ReplicationResult]]]:
    """The spare curve, incrementally: counts in ascending order, stopping at the first count where
    no replication ran out of spares (the job never waited for a node, so more spares change only
    the idle spares' own faults); the larger counts repeat that point with `derived_from`.
    `reuse` holds replications already run at a count with the same seed (the main run): replication
    i has the same seed whatever the run count, so its first `runs` are exactly the sweep's."""
    grid = sorted(set(spares))
    points: list[Point] = []
    simulated: dict[int, list[ReplicationResult]] = {}
    base: Point | None = None
    for i, s in enumerate(grid):
        if base is not None:
            points.append(dataclasses.replace(base, x=float(s), derived_from=base.x))
            continue
        have = (reuse or {}).get(s)
        if have is not None and len(have) >= runs:
            results = list(have[:runs])
        else:
            results = run_replications(p.with_changes(spares=s), seed, runs, workers, pool=pool)
        simulated[s] = results
        m = summarize(p.with_changes(spares=s), results)
        pt = Point(float(s), m.ettr, m.job_capacity_availability, m.spares_exhausted)
        points.append(pt)
        if not any(r.spares_exhausted for r in results):
            base = pt
        if progress is not None:
            progress(i + 1, len(grid))
    if progress is not None:
        progress(len(grid), len(grid))
    return points, simulated


# Work budget of a sweep stage, in simulated events: a sweep at 131k GPUs for a year gets a few
# replications per point, one at 16k GPUs for 54 days gets 50 (common random numbers keep the
# differences between points tight even with few).
SWEEP_EVENT_BUDGET = 1_000_000


def budget_runs(results: Sequence[ReplicationResult], points: int, runs: int,
                budget: int = SWEEP_EVENT_BUDGET) -> int:
    """Replications per point so that `points` points cost about `budget` events (2 to `runs`)."""
    per_run = max(1.0, float(np.mean([r.events for r in results])))
    return int(max(2, min(runs, 50, budget // (per_run * max(points, 1)))))
