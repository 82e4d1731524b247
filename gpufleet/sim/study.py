"""A whole `gpufleet simulate` study: replications, metrics, sweeps, optional recommendation, and
its record on disk (JSON with the resolved config and seed, plus plots)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.sim.engine import ReplicationResult
from gpufleet.sim.metrics import Metrics, summarize
from gpufleet.sim.params import SimParams
from gpufleet.sim.recommend import Candidate, recommend
from gpufleet.sim.runner import run_replications
from gpufleet.sim.sweeps import Point, ettr_vs_interval, ettr_vs_spares, spare_grid, spare_points

SCHEMA = "gpufleet.simulate/v1"


@dataclass(frozen=True)
class Study:
    params: SimParams
    seed: int
    runs: int
    metrics: Metrics
    by_interval: list[Point]
    by_spares: list[Point]
    ettr_target: float
    availability_target: float
    inputs: dict[str, str]
    elapsed_seconds: float
    best: Candidate | None = None
    candidates: list[Candidate] = field(default_factory=list)
    recommended: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "seed": self.seed,
            "runs": self.runs,
            "inputs": self.inputs,
            "config": self.params.as_dict(),
            "slo_targets": {"ettr": self.ettr_target, "availability": self.availability_target},
            "metrics": self.metrics.as_dict(),
            "sweeps": {
                "ettr_vs_checkpoint_interval_minutes": [p.as_dict() for p in self.by_interval],
                "ettr_vs_spares": [p.as_dict() for p in self.by_spares],
            },
            "elapsed_seconds": self.elapsed_seconds,
        }
        if self.recommended:
            out["recommendation"] = {
                "best": self.best.as_dict() if self.best else None,
                "candidates": [c.as_dict() for c in self.candidates],
            }
        return out


def run_study(
    p: SimParams,
    seed: int,
    runs: int,
    *,
    workers: int | None = None,
    ettr_target: float = 0.95,
    availability_target: float = 0.999,
    inputs: dict[str, str] | None = None,
    sweep_spares: bool = True,
    sweep_runs: int | None = None,
    do_recommend: bool = False,
) -> Study:
    t0 = time.perf_counter()
    results: list[ReplicationResult] = run_replications(p, seed, runs, workers)
    metrics = summarize(p, results)
    by_interval = ettr_vs_interval(p, results)
    srun = sweep_runs if sweep_runs is not None else max(1, min(runs, 50))
    best: Candidate | None = None
    cands: list[Candidate] = []
    by_spares: list[Point] = []
    if do_recommend:
        best, cands = recommend(p, ettr_target, availability_target, seed, runs, workers)
        # The spare curve at the grid interval nearest to the stack's own.
        here = min({c.interval_minutes for c in cands},
                   key=lambda m: abs(m * 60.0 - p.checkpoint_interval_seconds))
        by_spares = [Point(float(c.spares), c.ettr, c.capacity)
                     for c in sorted(cands, key=lambda c: c.spares) if c.interval_minutes == here]
    elif sweep_spares:
        by_spares = spare_points(p, ettr_vs_spares(p, seed, srun, spare_grid(p), workers))
    return Study(p, seed, runs, metrics, by_interval, by_spares, ettr_target, availability_target,
                 inputs or {}, time.perf_counter() - t0, best, cands, do_recommend)


def write_study(study: Study, out_dir: Path, plots: bool = True) -> list[Path]:
    """Write `simulate.json` and the plots; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "simulate.json"]
    files[0].write_text(json.dumps(study.as_dict(), indent=2, allow_nan=True) + "\n", encoding="utf-8")
    if plots:
        from gpufleet.sim import plots as pl  # matplotlib only when plotting

        files.append(pl.ettr_vs_interval_plot(study.by_interval, study.ettr_target,
                                              out_dir / "ettr_vs_checkpoint_interval.png"))
        if study.by_spares:
            files.append(pl.ettr_vs_spares_plot(study.by_spares, study.ettr_target,
                                                out_dir / "ettr_vs_spares.png"))
        files.append(pl.lost_by_cause_plot(study.metrics.lost_gpu_hours_by_cause,
                                           out_dir / "lost_by_cause.png"))
    return files
