"""A whole `gpufleet simulate` study: replications, metrics, sweeps, sensitivities, the game-day
measurements beside their projection, an optional recommendation, and its record on disk (JSON
with the resolved config and seed, a Markdown report, plots).

Cost at scale: one process pool serves every stage; the spare sweep is incremental
(`sweeps.spare_sweep`) and reuses the main run's replications at the stack's own count.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.core.taxonomy import FaultClass
from gpufleet.sim import defaults as d
from gpufleet.sim.engine import ReplicationResult
from gpufleet.sim.metrics import Metrics, ettr_values, summarize
from gpufleet.sim.params import SimParams
from gpufleet.sim.recommend import Candidate, recommend
from gpufleet.sim.runner import default_workers, run_replications
from gpufleet.sim.stats import Estimate, mean_ci
from gpufleet.sim.sweeps import Point, budget_runs, ettr_vs_interval, spare_grid, spare_sweep

SCHEMA = "gpufleet.simulate/v1"

# (stage, done, total): stages are "replications", "sensitivity", "spares", "recommend".
StudyProgress = Callable[[str, int, int], None]

CALIBRATION = (
    "Fault rates are the catalog's: Llama 3 405B's interruption counts divided by its GPU-hours "
    "(Meta 2024, Table 5). A run at Llama 3's size and length returns about its 419 interruptions "
    "by construction: that back-test checks the bookkeeping, it does not validate the rates. "
    "Out-of-sample checks (fit on one published source, predict another) and their errors are in "
    "docs/simulator.md, 'Validation'. A projected ETTR also depends on handling parameters: "
    "detection mode, checkpoint interval and write cost (see `sensitivity`)."
)
WRITE_FACTORS = (0.0, 0.5, 1.0, 2.0, 4.0)
# Runs chosen by precision (`precision=`, `gpufleet simulate` without --runs): at least
# MIN_PRECISE_RUNS, so the interval itself is trusted (the t-based 95% interval of fewer runs is
# wide and its own width noisy), until the ETTR's 95% interval is within +/- DEFAULT_PRECISION (a
# quarter of a percentage point: finer than a stack's ETTR target is written), at most
# AUTO_MAX_RUNS (the former fixed default). A 131k-GPU year stops at the first 10 runs; a small
# cluster's, whose runs differ more, runs longer.
MIN_PRECISE_RUNS = 10
DEFAULT_PRECISION = 0.0025
AUTO_MAX_RUNS = 200


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
    sensitivity: dict[str, Any] = field(default_factory=dict)
    gameday: list[dict[str, Any]] = field(default_factory=list)
    # How `runs` was chosen: None = asked for; else the ETTR half-width it stopped at (precise_runs).
    precision: dict[str, float | int] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "seed": self.seed,
            "runs": self.runs,
            "runs_chosen_by_precision": self.precision,
            "inputs": self.inputs,
            "config": self.params.as_dict(),
            "calibration": CALIBRATION,
            "slo_targets": {"ettr": self.ettr_target, "availability": self.availability_target},
            "metrics": self.metrics.as_dict(),
            "sweeps": {
                "ettr_vs_checkpoint_interval_minutes": [p.as_dict() for p in self.by_interval],
                "ettr_vs_spares": [p.as_dict() for p in self.by_spares],
            },
            "sensitivity": self.sensitivity,
            "gameday_projection": self.gameday,
            "elapsed_seconds": self.elapsed_seconds,
        }
        if self.recommended:
            out["recommendation"] = {
                "best": self.best.as_dict() if self.best else None,
                "candidates": [c.as_dict() for c in self.candidates],
            }
        return out


@contextmanager
def _pool(workers: int | None, runs: int) -> Iterator[Executor | None]:
    w = min(workers if workers is not None else default_workers(), max(runs, 1))
    if w <= 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=w) as ex:
        yield ex


def with_detection(p: SimParams, mode: str) -> SimParams:
    """Every rated node-level class detected actively (ByteRobust's figures) or passively (the
    collective timeout); store faults are the store's and keep theirs."""
    handling = dict(p.handling)
    for cls in {k.fault_class for k in p.kinds if k.per_node_hour > 0}:
        if cls in (FaultClass.STORAGE_OUTAGE, FaultClass.STORAGE_DEGRADED):
            continue
        det = (d.ACTIVE_DETECT_SECONDS[cls].value if mode == "active"
               else p.collective_timeout_seconds)
        h = handling[cls]
        measured = tuple((det, i, f) for _, i, f in h.measured)
        handling[cls] = dataclasses.replace(h, detect_seconds=det, detect_source=f"sensitivity: {mode}",
                                            measured=measured)
    return p.with_changes(handling=handling)


def sensitivity(p: SimParams, results: list[ReplicationResult], seed: int, runs: int,
                workers: int | None, pool: Executor | None,
                progress: StudyProgress | None = None) -> dict[str, Any]:
    """ETTR against the handling parameters a projection depends on: detection mode (re-simulated
    with the same seeds), checkpoint interval and write cost (re-accounted, same replications)."""
    base = mean_ci(ettr_values(p, results[:runs]), 0.0, 1.0)
    detection = [{"mode": "as configured", "ettr": base.as_dict()}]
    for i, mode in enumerate(("active", "passive")):
        q = with_detection(p, mode)
        same = all((q.handling[c].detect_seconds, q.handling[c].measured)
                   == (p.handling[c].detect_seconds, p.handling[c].measured) for c in p.handling)
        # (the same times give the same replications: seeds are per replication)
        r = results[:runs] if same else run_replications(q, seed, runs, workers, pool=pool)
        detection.append({"mode": f"all {mode}", "ettr": mean_ci(ettr_values(q, r), 0.0, 1.0).as_dict()})
        if progress is not None:
            progress("sensitivity", i + 1, 2)
    w0 = p.checkpoint_write_seconds
    writes = [{"write_seconds": w0 * f, "factor": f,
               "ettr": mean_ci(ettr_values(p, results, write=w0 * f), 0.0, 1.0).as_dict()}
              for f in WRITE_FACTORS]
    return {"detection": detection, "checkpoint_write": writes,
            "note": "checkpoint interval: sweeps.ettr_vs_checkpoint_interval_minutes"}


def gameday_projection(p: SimParams, results: list[ReplicationResult]) -> list[dict[str, Any]]:
    """Each class measured by a game-day, its measurements beside the projected downtime per
    interruption of that class at the stack's full size."""
    out = []
    for cls, h in p.handling.items():
        if "game-day" not in h.detect_source and "game-day" not in h.restart_floor_source:
            continue
        idx = [i for i, k in enumerate(p.kinds) if k.fault_class is cls]
        ints = float(sum(r.interruptions_by_kind[idx].sum() for r in results))
        down = float(sum(r.down_seconds_by_kind[idx].sum() for r in results))
        triples = h.measured or ((h.detect_seconds, h.isolate_seconds, h.restart_floor_seconds),)

        def med(j: int, t: tuple[tuple[float, float, float], ...] = triples) -> float:
            return float(statistics.median(x[j] for x in t))

        out.append({
            "fault_class": cls.value,
            "experiments": len(triples),
            "measured": {
                "detect_seconds": med(0), "isolate_seconds": med(1), "restart_seconds": med(2),
                "detect_range": [min(x[0] for x in triples), max(x[0] for x in triples)],
            },
            "projected": {
                "job_gpus": p.job_gpus,
                "restart_seconds": max(p.restart_seconds, med(2)),
                "interruptions_per_run": ints / len(results),
                "mean_downtime_per_interruption_seconds": down / ints if ints else None,
            },
        })
    return out


def ettr_half_width(p: SimParams, results: list[ReplicationResult]) -> float:
    e = summarize(p, results).ettr
    return (e.high - e.low) / 2.0


def precise_runs(
    p: SimParams, seed: int, precision: float, max_runs: int, workers: int | None, *,
    pool: Executor | None = None, progress: Callable[[int, int], None] | None = None,
) -> tuple[list[ReplicationResult], dict[str, float | int]]:
    """Replications until the ETTR's 95% interval is within +/- `precision` (sequential sampling:
    MIN_PRECISE_RUNS first, then doubling, at most `max_runs`). Replication i is always child i of
    the seed, so the runs are the first N of the `--runs max_runs` study, whatever N comes out."""
    n = min(MIN_PRECISE_RUNS, max_runs)
    results = run_replications(p, seed, n, workers, pool=pool, progress=_offset(progress, 0, max_runs))
    while (width := ettr_half_width(p, results)) > precision and len(results) < max_runs:
        more = min(max_runs - len(results), len(results))
        results += run_replications(p, seed, more, workers, pool=pool, start=len(results),
                                    progress=_offset(progress, len(results), max_runs))
    return results, {"target_half_width": precision, "half_width": width, "max_runs": max_runs,
                     "min_runs": min(MIN_PRECISE_RUNS, max_runs)}


def _offset(progress: Callable[[int, int], None] | None, base: int,
            total: int) -> Callable[[int, int], None] | None:
    """A batch's progress as the whole sequence's (`base` runs done before the batch)."""
    if progress is None:
        return None
    report = progress
    return lambda done, _: report(base + done, total)


def run_study(
    p: SimParams,
    seed: int,
    runs: int,
    *,
    precision: float | None = None,
    workers: int | None = None,
    ettr_target: float = 0.95,
    availability_target: float = 0.999,
    inputs: dict[str, str] | None = None,
    sweep_spares: bool = True,
    sweep_runs: int | None = None,
    do_recommend: bool = False,
    do_sensitivity: bool = True,
    progress: StudyProgress | None = None,
) -> Study:
    """`progress(stage, done, total)` is called as replications finish (stages: replications,
    sensitivity, spares, recommend). With `precision`, `runs` is the most replications and fewer
    are run once the ETTR's 95% interval is that narrow (precise_runs). Sweeps and sensitivities
    use `sweep_runs` replications per point, by default as many as an event budget allows (2 to
    min(runs, 50))."""
    t0 = time.perf_counter()
    chosen: dict[str, float | int] | None = None
    with _pool(workers, runs) as pool:
        step = (lambda done, total: progress("replications", done, total)) if progress else None
        results: list[ReplicationResult]
        if precision is None:
            results = run_replications(p, seed, runs, workers, progress=step, pool=pool)
        else:
            results, chosen = precise_runs(p, seed, precision, runs, workers, pool=pool, progress=step)
            runs = len(results)
        # Sweeps get an event budget (sweeps.budget_runs) unless told how many runs to use.
        srun = (sweep_runs if sweep_runs is not None
                else min(runs, budget_runs(results, len(spare_grid(p)) // 2 + 2, runs)))
        metrics = summarize(p, results)
        by_interval = ettr_vs_interval(p, results)
        sens = (sensitivity(p, results, seed, srun, workers, pool, progress)
                if do_sensitivity else {})
        best: Candidate | None = None
        cands: list[Candidate] = []
        by_spares: list[Point] = []
        reuse = {p.spares: results}
        if do_recommend:
            rstep = (lambda done, total: progress("recommend", done, total)) if progress else None
            best, cands = recommend(p, ettr_target, availability_target, seed, runs, workers,
                                    pool=pool, reuse=reuse, progress=rstep)
            # The spare curve at the grid interval nearest to the stack's own.
            here = min({c.interval_minutes for c in cands},
                       key=lambda m: abs(m * 60.0 - p.checkpoint_interval_seconds))
            by_spares = [Point(float(c.spares), c.ettr, c.capacity)
                         for c in sorted(cands, key=lambda c: c.spares) if c.interval_minutes == here]
        elif sweep_spares:
            sstep = (lambda done, total: progress("spares", done, total)) if progress else None
            by_spares, _ = spare_sweep(p, seed, srun, spare_grid(p), workers, pool=pool,
                                       reuse=reuse, progress=sstep)
    return Study(p, seed, runs, metrics, by_interval, by_spares, ettr_target, availability_target,
                 inputs or {}, time.perf_counter() - t0, best, cands, do_recommend, sens,
                 gameday_projection(p, results), chosen)


def _ci(e: dict[str, Any] | Estimate, fmt: str = "{:.4f}") -> str:
    x = e.as_dict() if isinstance(e, Estimate) else e
    return f"{fmt.format(x['mean'])} [{fmt.format(x['ci95_low'])}, {fmt.format(x['ci95_high'])}]"


def report_markdown(s: Study) -> str:
    """The study as a short Markdown report (simulate.md)."""
    p, m = s.params, s.metrics
    lines = [
        f"# Reliability projection: {p.job_gpus:,} GPUs ({p.pool}), {p.days:g} days, {s.runs} runs, "
        f"seed {s.seed}",
        "",
        *([f"- {s.runs} runs chosen by precision: the ETTR 95% interval reached +/- "
           f"{s.precision['half_width']:.4f} (asked +/- {s.precision['target_half_width']:g}; "
           f"{s.precision['min_runs']} to {s.precision['max_runs']} runs, `--runs N` for exactly N)"]
          if s.precision else []),
        f"- ETTR {_ci(m.ettr)} (target {s.ettr_target:g}); job MTBF {_ci(m.mtbf_hours, '{:.2f}')} h; "
        f"interruptions per day {_ci(m.interruptions_per_day, '{:.2f}')}",
        f"- job capacity availability {_ci(m.job_capacity_availability, '{:.5f}')}; "
        f"P(spares exhausted) {_ci(m.spares_exhausted, '{:.3f}')}",
        "",
        "## Calibration",
        "",
        CALIBRATION,
        "",
    ]
    if s.sensitivity:
        lines += ["## Sensitivity of ETTR", "", "| parameter | value | ETTR (95% CI) |", "|---|---|---|"]
        for row in s.sensitivity["detection"]:
            lines.append(f"| detection | {row['mode']} | {_ci(row['ettr'])} |")
        for pt in s.by_interval:
            lines.append(f"| checkpoint interval | {pt.x:g} min | {_ci(pt.ettr)} |")
        for row in s.sensitivity["checkpoint_write"]:
            lines.append(f"| checkpoint write | {row['write_seconds']:g} s | {_ci(row['ettr'])} |")
        lines.append("")
    if s.gameday:
        lines += ["## Game-day measurements and the projection at full size", "",
                  "| class | experiments | detect s | isolate s | restart s (measured) | "
                  "restart s (at size) | downtime per interruption s (projected) |",
                  "|---|---|---|---|---|---|---|"]
        for g in s.gameday:
            me, pr = g["measured"], g["projected"]
            dt = pr["mean_downtime_per_interruption_seconds"]
            lines.append(f"| {g['fault_class']} | {g['experiments']} | {me['detect_seconds']:g} | "
                         f"{me['isolate_seconds']:g} | {me['restart_seconds']:g} | "
                         f"{pr['restart_seconds']:.0f} | {'-' if dt is None else f'{dt:.0f}'} |")
        lines.append("")
    return "\n".join(lines)


def write_study(study: Study, out_dir: Path, plots: bool = True) -> list[Path]:
    """Write `simulate.json`, `simulate.md` and the plots; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "simulate.json", out_dir / "simulate.md"]
    files[0].write_text(json.dumps(study.as_dict(), indent=2, allow_nan=True) + "\n", encoding="utf-8")
    files[1].write_text(report_markdown(study) + "\n", encoding="utf-8")
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


__all__ = ["CALIBRATION", "Study", "StudyProgress", "gameday_projection", "report_markdown",
           "run_study", "sensitivity", "with_detection", "write_study"]
