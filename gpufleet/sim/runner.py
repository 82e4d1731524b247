"""Monte Carlo replications, serial or in worker processes, with identical results either way.

Replication i always gets child i of `SeedSequence(seed)`, whatever process runs it, so a run is
reproducible from (resolved config, seed) and serial equals parallel.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gpufleet.sim.engine import ReplicationResult, simulate_once
from gpufleet.sim.params import SimParams


def replication_seeds(seed: int, runs: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(runs)


def _batch(p: SimParams, seeds: list[np.random.SeedSequence]) -> list[ReplicationResult]:
    return [simulate_once(p, s) for s in seeds]


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def run_replications(
    p: SimParams, seed: int, runs: int, workers: int | None = None
) -> list[ReplicationResult]:
    """`runs` replications of `p`; workers=1 runs in this process, more use a process pool."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    seeds = replication_seeds(seed, runs)
    w = min(workers if workers is not None else default_workers(), runs)
    if w <= 1:
        return _batch(p, seeds)
    # A few contiguous chunks per worker: little pickling, balanced enough, order preserved.
    chunks = max(1, min(runs, 4 * w))
    bounds = np.linspace(0, runs, chunks + 1).astype(int)
    parts = [seeds[a:b] for a, b in itertools.pairwise(bounds.tolist()) if b > a]
    with ProcessPoolExecutor(max_workers=w) as pool:
        futures = [pool.submit(_batch, p, part) for part in parts]
        return [r for f in futures for r in f.result()]
