"""Monte Carlo replications, serial or in worker processes, with identical results either way.

Replication i always gets child i of `SeedSequence(seed)`, whatever process runs it, so a run is
reproducible from (resolved config, seed) and serial equals parallel.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed

import numpy as np

from gpufleet.sim.engine import ReplicationResult, simulate_once
from gpufleet.sim.params import SimParams


def replication_seeds(seed: int, runs: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(runs)


def _batch(p: SimParams, seeds: list[np.random.SeedSequence]) -> list[ReplicationResult]:
    return [simulate_once(p, s) for s in seeds]


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


Progress = Callable[[int, int], None]  # (replications done, replications asked for)


def run_replications(
    p: SimParams, seed: int, runs: int, workers: int | None = None, *,
    progress: Progress | None = None, pool: Executor | None = None, start: int = 0,
) -> list[ReplicationResult]:
    """`runs` replications of `p`, replication i with child `start + i` of the seed (so more runs
    continue a sequence rather than repeat it); workers=1 runs in this process, more use a process
    pool (or the given `pool`, so that a study starts its processes once). `progress` is called
    after each finished batch."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    seeds = replication_seeds(seed, start + runs)[start:]
    w = min(workers if workers is not None else default_workers(), runs)
    if w <= 1 and pool is None:
        out = []
        for i, s in enumerate(seeds):
            out.append(simulate_once(p, s))
            if progress is not None:
                progress(i + 1, runs)
        return out
    # A few contiguous chunks per worker: little pickling, balanced enough, order preserved.
    chunks = max(1, min(runs, 4 * max(w, 2)))
    bounds = np.linspace(0, runs, chunks + 1).astype(int)
    parts = [seeds[a:b] for a, b in itertools.pairwise(bounds.tolist()) if b > a]
    own = pool is None
    ex = pool if pool is not None else ProcessPoolExecutor(max_workers=w)
    try:
        futures = [ex.submit(_batch, p, part) for part in parts]
        if progress is not None:
            size = {f: len(part) for f, part in zip(futures, parts, strict=True)}
            done = 0
            for f in as_completed(futures):
                done += size[f]
                progress(done, runs)
        return [r for f in futures for r in f.result()]
    finally:
        if own:
            ex.shutdown()
