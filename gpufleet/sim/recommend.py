"""Search the checkpoint interval and spare count that meet the SLOs at the least cost.

Cost = GPU-hours bought per useful GPU-hour = (job nodes + spares) / (job nodes x ETTR): spares
cost idle hardware, a long interval costs lost work, a short one costs write time. A candidate
meets the SLOs when the lower end of its 95% interval clears them: ETTR >= slos.ettr, and job
capacity availability (share of time the job is not waiting for nodes) >= slos.availability.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from gpufleet.sim.engine import ReplicationResult
from gpufleet.sim.metrics import ettr_values, summarize
from gpufleet.sim.params import SimParams
from gpufleet.sim.stats import Estimate, mean_ci
from gpufleet.sim.sweeps import INTERVALS_MINUTES, spare_grid, spare_sweep


@dataclass(frozen=True)
class Candidate:
    spares: int
    interval_minutes: float
    ettr: Estimate
    capacity: Estimate
    cost: float
    feasible: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "spares": self.spares, "checkpoint_interval_minutes": self.interval_minutes,
            "ettr": self.ettr.as_dict(), "job_capacity_availability": self.capacity.as_dict(),
            "gpu_hours_per_useful_gpu_hour": self.cost, "meets_slos": self.feasible,
        }


def cost(job_nodes: int, spares: int, ettr: float) -> float:
    return (job_nodes + spares) / (job_nodes * ettr) if ettr > 0 else float("inf")


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """The cheapest feasible candidate (ties: fewer spares, then the longer interval)."""
    ok = [c for c in candidates if c.feasible]
    return min(ok, key=lambda c: (c.cost, c.spares, -c.interval_minutes)) if ok else None


def recommend(
    p: SimParams,
    ettr_target: float,
    availability_target: float,
    seed: int,
    runs: int,
    workers: int | None = None,
    intervals: Sequence[float] = INTERVALS_MINUTES,
    spares: Sequence[int] | None = None,
    *,
    pool: Executor | None = None,
    reuse: dict[int, list[ReplicationResult]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Candidate | None, list[Candidate]]:
    """Candidates at every interval for each spare count simulated by the incremental sweep
    (`spare_sweep`): counts above the first one that never ran out of spares would give the same
    ETTR for more spares, so they cost more and are not listed."""
    grid = list(spares) if spares is not None else spare_grid(p)
    _, by_spares = spare_sweep(p, seed, runs, grid, workers, pool=pool, reuse=reuse, progress=progress)
    out = []
    for s, results in by_spares.items():
        ps = p.with_changes(spares=s)
        capacity = summarize(ps, results).job_capacity_availability
        for m in intervals:
            e = mean_ci(ettr_values(ps, results, interval=m * 60.0), 0.0, 1.0)
            feasible = e.low >= ettr_target and capacity.low >= availability_target
            out.append(Candidate(s, m, e, capacity, cost(p.job_nodes, s, e.mean), feasible))
    return choose(out), out
