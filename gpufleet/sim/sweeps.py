"""ETTR as a function of the checkpoint interval and of the spare count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"x": self.x, "ettr": self.ettr.as_dict()}
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
    """0, 1, 2, 4, ... up to ~8% of the job's nodes, plus the stack's own count and, when a leaf
    switch can fail, one leaf's worth of nodes (a leaf outage takes them all at once)."""
    top = max(8, int(0.08 * p.job_nodes), 2 * p.spares)
    grid = {0, p.spares}
    if any(p.handling[k.fault_class].domain == "leaf" and k.per_node_hour > 0 for k in p.kinds):
        grid.add(p.nodes_per_leaf)
    s = 1
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
