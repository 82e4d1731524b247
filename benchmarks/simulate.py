"""Benchmark of `gpufleet simulate` (issues 5 and 18): prints figures and writes
benchmarks/results/simulate.json.

Targets: one replication of 1 year at 16,384 GPUs (2,048 nodes) in <= 5 s; 200 replications of 54
days at 16,384 GPUs in <= 60 s on 2 cores (processes); events per second at 1k, 16k and 131k GPUs;
a whole default study (what `gpufleet simulate` does without --runs: replications until the
ETTR's interval is within +/- 0.0025, sensitivity, incremental spare sweep) at 131,072 GPUs for
365 days in <= 60 s on 2 cores; the out-of-sample errors (gpufleet.sim.validation).
Medians of repeated measurements. Not a test: no timed asserts.

    .venv/bin/python benchmarks/simulate.py [--repeats 5] [--workers 2] [--study-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.catalog import load_catalog
from gpufleet.config import StackSpec
from gpufleet.sim import (
    load_scenario,
    replication_seeds,
    resolve,
    run_replications,
    run_study,
    simulate_once,
)
from gpufleet.sim.params import SimParams
from gpufleet.sim.study import AUTO_MAX_RUNS, DEFAULT_PRECISION
from gpufleet.sim.validation import out_of_sample, table_markdown

ROOT = Path(__file__).resolve().parents[1]


def cluster(nodes: int, spares: int) -> StackSpec:
    return StackSpec.model_validate({
        "cluster": {"name": "bench", "environment": "production"},
        "nodePools": [{
            "name": "h100", "accelerator": "nvidia-h100-sxm", "gpusPerNode": 8, "nodes": nodes,
            "spares": spares, "provisioning": {"kind": "static", "nodeNamePattern": "n-{index}"},
        }],
        "fabric": {"kind": "roce", "railsPerNode": 8, "nicsPerNode": 8, "linkSpeedGbps": 400,
                   "mode": "rdma-shared"},
        "storage": {"checkpoint": {"location": "/ckpt"}},
        "scheduler": {"kind": "slurm", "queues": [{"name": "q"}]},
        "monitoring": {"grafana": False},
    })


def params(gpus: int, days: float) -> SimParams:
    nodes = gpus // 8
    sc = load_scenario(ROOT / "scenarios" / "llama3-restart-costs.yaml")
    return resolve(cluster(nodes, max(1, nodes // 32)), load_catalog(), sc, days=days)


def timed_once(p: SimParams, seed: int) -> tuple[float, int]:
    t = time.perf_counter()
    r = simulate_once(p, replication_seeds(seed, 1)[0])
    return time.perf_counter() - t, r.events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--study-repeats", type=int, default=3)
    ap.add_argument("--study-runs", type=int, default=None,
                    help="a fixed number of runs (default: as `gpufleet simulate` without --runs: until "
                         "the ETTR's interval is within its default precision)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "simulate.json")
    a = ap.parse_args()
    out: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                 "python": platform.python_version(), "machine": platform.machine()},
        "repeats": a.repeats, "workers": a.workers,
        "load_average_at_start": os.getloadavg(),
    }

    p_year = params(16_384, 365)
    runs = [timed_once(p_year, s) for s in range(a.repeats)]
    secs = statistics.median(t for t, _ in runs)
    ev = statistics.median(e for _, e in runs)
    out["one_year_16k"] = {"median_seconds": secs, "target_seconds": 5.0, "events": ev,
                           "events_per_second": ev / secs, "all_seconds": [t for t, _ in runs]}
    print(f"1 replication, 365 days, 16,384 GPUs: {secs:.3f} s median ({ev:.0f} events, "
          f"{ev / secs:,.0f} events/s)  target <= 5 s")

    p54 = params(16_384, 54)
    walls = []
    for rep in range(max(1, min(3, a.repeats))):
        t = time.perf_counter()
        res = run_replications(p54, seed=rep, runs=200, workers=a.workers)
        walls.append(time.perf_counter() - t)
    events = sum(r.events for r in res)
    wall = statistics.median(walls)
    out["runs200_54d_16k"] = {"median_seconds": wall, "target_seconds": 60.0, "workers": a.workers,
                              "events": events, "events_per_second": events / wall, "all_seconds": walls,
                              "mean_interruptions": float(np.mean([r.interruptions for r in res]))}
    print(f"200 replications, 54 days, 16,384 GPUs, {a.workers} processes: {wall:.2f} s median "
          f"({events / wall:,.0f} events/s)  target <= 60 s")

    scaling = []
    print("scaling (1 replication, 54 days; medians):")
    print(f"{'GPUs':>8} {'nodes':>7} {'events':>9} {'seconds':>9} {'us/event':>9} {'events/s':>9}")
    for gpus in (1_024, 16_384, 131_072):
        p = params(gpus, 54)
        rs = [timed_once(p, s) for s in range(a.repeats)]
        t = statistics.median(x for x, _ in rs)
        e = statistics.median(y for _, y in rs)
        scaling.append({"gpus": gpus, "nodes": gpus // 8, "events": e, "median_seconds": t,
                        "us_per_event": 1e6 * t / max(e, 1), "events_per_second": e / t})
        print(f"{gpus:>8,} {gpus // 8:>7,} {e:>9.0f} {t:>9.4f} {1e6 * t / max(e, 1):>9.1f} "
              f"{e / t:>9,.0f}")
    ev_ratio = scaling[-1]["events"] / scaling[0]["events"]
    t_ratio = scaling[-1]["median_seconds"] / scaling[0]["median_seconds"]
    out["scaling_54d"] = {"points": scaling, "events_ratio_131k_over_1k": ev_ratio,
                          "time_ratio_131k_over_1k": t_ratio}
    print(f"131,072 vs 1,024 GPUs: events x{ev_ratio:.0f}, time x{t_ratio:.0f}")

    p_big = params(131_072, 365)
    studies: list[dict[str, Any]] = []
    study_walls: list[float] = []
    for rep in range(a.study_repeats):
        stages: dict[str, float] = {}
        t0 = time.perf_counter()

        def mark(stage: str, done: int, total: int, stages: dict[str, float] = stages,
                 t0: float = t0) -> None:
            stages[stage] = time.perf_counter() - t0

        st = run_study(p_big, seed=1 + rep, runs=a.study_runs or AUTO_MAX_RUNS,
                       precision=None if a.study_runs else DEFAULT_PRECISION, workers=a.workers,
                       progress=mark)
        study_walls.append(time.perf_counter() - t0)
        studies.append({"seconds": study_walls[-1], "stage_end_seconds": stages, "runs": st.runs,
                        "runs_chosen_by_precision": st.precision,
                        "ettr": st.metrics.ettr.as_dict(),
                        "spare_points_simulated": sum(pt.derived_from is None for pt in st.by_spares),
                        "spare_points": len(st.by_spares)})
        ends = ", ".join(f"{k} {v:.0f} s" for k, v in stages.items())
        print(f"study 131,072 GPUs, 365 days, {st.runs} runs, {a.workers} processes: "
              f"{study_walls[-1]:.1f} s (stages end at {ends})")
    if studies:
        med = statistics.median(study_walls)
        out["study_131k_365d"] = {"median_seconds": med, "target_seconds": 60.0,
                                  "runs": a.study_runs or f"by precision +/- {DEFAULT_PRECISION:g}",
                                  "workers": a.workers, "repeats": studies}
        print(f"study median {med:.1f} s  target <= 60 s")

    out["load_average_before_out_of_sample"] = os.getloadavg()
    rows = out_of_sample(seed=1, runs=20)
    out["out_of_sample"] = [r.as_dict() for r in rows]
    print(table_markdown(rows))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
