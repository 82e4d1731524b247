"""Game-day benchmark and repeatability: a fresh sandbox, then the suite N times on it. Per
experiment: pass rate (met / runs), median and p90 of detect / isolate / recover seconds, their
ratio to the floor the configured intervals set (gpufleet.slo.floor_seconds, docs/slo.md); per
suite: green or not (N of N is the repeatability figure), wall time (the first includes sandbox
bring-up); and every healing event the runner needed to restore the steady state.

    .venv/bin/python benchmarks/gameday.py [--runs 3] [--experiments a,b] [--stack sandbox]  # as root
    .venv/bin/python benchmarks/gameday.py --from-reports reports/bench-gameday  # no run

Prints a table and writes benchmarks/results/gameday.json. The figures are read from each suite's
summary.json (gpufleet.core.gameday_summary), so --from-reports aggregates the suites of an
earlier run again without running them. Figures, not asserts: the issue's
targets are printed next to the numbers (fatal GPU fault drained <= 15 s and resumed <= 60 s,
node crash resumed <= 60 s, link down detected <= 15 s, each recovery within 1.5x of its floor,
suite with bring-up <= 15 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.config import StackSpec, duration_seconds, load_named_stack
from gpufleet.core.gameday_summary import SummaryDoc
from gpufleet.gameday import GamedayOptions, run_gameday, write_report
from gpufleet.gameday.runner import Listener, teardown_sandbox
from gpufleet.slo import Floor, Intervals, floor_seconds

REPO = Path(__file__).resolve().parents[1]
# Slurm's scheduler pass in the sandbox (gpufleet/sandbox/templates/slurm.conf.j2:
# SchedulerParameters=...,sched_interval=2; sandbox-notes.md pitfall 5).
SANDBOX_SCHED_INTERVAL_S = 2.0
RATIO_TARGET = 1.5
SUITE_TARGET_S = 15 * 60


class Printer(Listener):
    def sandbox(self, message: str) -> None:
        print(f"  sandbox: {message}", flush=True)

    def experiment_done(self, index: int, result: Any) -> None:
        print(f"  {result.name}: {result.result.value} ({result.wall_seconds:.0f} s)", flush=True)


def intervals_for(stack: StackSpec, catalog: Catalog, fault_id: str | None) -> Intervals:
    """The configured intervals that bound one fault's detection and recovery."""
    fault = None
    if fault_id:
        try:
            fault = catalog.get(fault_id)
        except (KeyError, ValueError):
            fault = None
    sb = stack.sandbox
    scrape = duration_seconds(sb.scrape_interval if sb else stack.monitoring.dcgm_scrape_interval)
    rule_for = duration_seconds(fault.alert.for_) if fault and fault.alert else None
    health = float(sb.slurm.health_check_interval) if sb and fault and fault.health_check else None
    return Intervals(
        scrape_seconds=scrape,
        evaluation_seconds=duration_seconds(stack.monitoring.evaluation_interval),
        rule_for_seconds=rule_for,
        health_check_seconds=health,
        slurmd_timeout_seconds=float(sb.slurm.slurmd_timeout) if sb else None,
        message_timeout_seconds=float(sb.slurm.message_timeout) if sb else 0.0,
        # The auto-resume controller resubmits at once (ADRs 0007, 0051): the node health check runs
        # as Slurm's Epilog, so a broken node is drained before the job is over.
        resubmit_delay_seconds=0.0,
        scheduler_interval_seconds=SANDBOX_SCHED_INTERVAL_S if sb else 0.0,
        process_group_timeout_seconds=float(sb.training.process_group_timeout_seconds) if sb else 0.0,
        checkpoint_load_seconds=stack.storage.checkpoint.load_seconds,
    )


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _p90(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    # Nearest rank (no interpolation beyond what was measured).
    return known[min(len(known) - 1, max(0, -(-9 * len(known) // 10) - 1))]


def _ratio(measured: float | None, floor: float | None) -> float | None:
    if measured is None or floor is None or floor <= 0:
        return None
    return measured / floor


def aggregate(runs: list[SummaryDoc], stack: StackSpec, catalog: Catalog) -> list[dict[str, Any]]:
    names = list(dict.fromkeys(e.name for run in runs for e in run.experiments))
    out = []
    for name in names:
        results = [e for run in runs for e in run.experiments if e.name == name]
        fault_class = next((e.fault_class for e in results if e.fault_class), None)
        fault_id = next((e.fault_id for e in results if e.fault_id), None)
        per: dict[str, list[float | None]] = {
            "detect": [e.measured.detect_seconds for e in results],
            "isolate": [e.measured.isolate_seconds for e in results],
            "recover": [e.measured.recover_seconds for e in results],
        }
        med = {k: _median(v) for k, v in per.items()}
        met = sum(1 for e in results if e.result == "met")
        iv = intervals_for(stack, catalog, fault_id)
        floor: Floor | None = floor_seconds(fault_class, iv) if fault_class else None
        fl = {"detect": floor.detect, "isolate": floor.isolate, "recover": floor.recover} if floor else {}
        out.append({
            "name": name,
            "fault_id": fault_id,
            "fault_class": fault_class,
            "runs": len(results),
            "results": [e.result for e in results],
            "pass_rate": met / len(results) if results else None,
            "samples_seconds": per,
            "median_seconds": med,
            "p90_seconds": {k: _p90(v) for k, v in per.items()},
            "floor_seconds": fl,
            "ratio_to_floor": {k: _ratio(med[k], fl.get(k)) for k in med},
            "intervals": iv.__dict__,
        })
    return out


def targets(rows: list[dict[str, Any]], suite_wall: float) -> list[dict[str, Any]]:
    def row(cls: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["fault_class"] == cls]

    checks: list[dict[str, Any]] = []
    for r in row("gpu-fatal"):
        checks.append({"target": f"{r['name']}: drained <= 15 s", "value": r["median_seconds"]["isolate"],
                       "limit": 15.0})
        checks.append({"target": f"{r['name']}: resumed <= 60 s", "value": r["median_seconds"]["recover"],
                       "limit": 60.0})
    for r in row("node-crash"):
        checks.append({"target": f"{r['name']}: resumed <= 60 s", "value": r["median_seconds"]["recover"],
                       "limit": 60.0})
    for r in row("fabric-link-down"):
        checks.append({"target": f"{r['name']}: detected <= 15 s", "value": r["median_seconds"]["detect"],
                       "limit": 15.0})
    for r in rows:
        ratio = r["ratio_to_floor"]["recover"]
        if ratio is not None:
            checks.append({"target": f"{r['name']}: recovery <= {RATIO_TARGET}x floor", "value": ratio,
                           "limit": RATIO_TARGET})
    checks.append({"target": "suite incl. bring-up <= 15 min", "value": suite_wall, "limit": SUITE_TARGET_S})
    for c in checks:
        c["met"] = None if c["value"] is None else c["value"] <= c["limit"]
    return checks


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", default="sandbox")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--experiments", default="", help="comma-separated names; default: the sandbox suite")
    ap.add_argument("--report-dir", type=Path, default=REPO / "reports" / "bench-gameday")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gameday.json")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per experiment")
    ap.add_argument("--from-reports", type=Path, default=None, metavar="DIR",
                    help="run nothing: aggregate DIR/run-N/summary.json of an earlier run")
    ap.add_argument("--note", default="", help="how the suites were run, kept in the result file")
    args = ap.parse_args(argv)
    # Every input before the work: a catalog or stack that does not load must not end an hour of
    # suites with a traceback and no figures.
    stack = load_named_stack(args.stack, REPO / "stacks")
    catalog = load_catalog()
    t = time.monotonic()
    if args.from_reports is not None:
        runs = read_suites(args.from_reports)
    elif os.geteuid() != 0:
        print("the sandbox game-day needs root", file=sys.stderr)
        return 2
    else:
        runs = run_suites(args, stack)
    return report(args, runs, stack, catalog, time.monotonic() - t)


def read_suites(report_dir: Path) -> list[SummaryDoc]:
    paths = sorted(report_dir.glob("run-*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    if not paths:
        raise SystemExit(f"{report_dir}: no run-N/summary.json to aggregate")
    return [SummaryDoc.model_validate_json(p.read_text()) for p in paths]


def run_suites(args: argparse.Namespace, stack: StackSpec) -> list[SummaryDoc]:
    names = tuple(n.strip() for n in args.experiments.split(",") if n.strip())
    runs: list[SummaryDoc] = []
    opts = GamedayOptions(stack=args.stack, backend="sandbox", experiments=names,
                          experiments_dir=REPO / "experiments", stacks_dir=REPO / "stacks",
                          keep_sandbox=True, experiment_timeout_s=args.timeout)
    # A fresh sandbox: whatever ran before is torn down, and the first run brings one up.
    teardown_sandbox(opts, Printer())
    try:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}", flush=True)
            o = GamedayOptions(**{**opts.__dict__, "report_dir": args.report_dir / f"run-{i + 1}"})
            write_report(run_gameday(o, Printer()), o.report_dir)
            runs.append(SummaryDoc.model_validate_json((o.report_dir / "summary.json").read_text()))
    finally:
        teardown_sandbox(opts, Printer())
    return runs


def report(args: argparse.Namespace, runs: list[SummaryDoc], stack: StackSpec, catalog: Catalog,
           total_s: float) -> int:
    rows = aggregate(runs, stack, catalog)
    green = sum(1 for r in runs if r.exit_code == 0)
    healing = [
        {"run": i + 1, "before": e.name, **(e.healing or {})}
        for i, run in enumerate(runs) for e in run.experiments if e.healing and e.healing.get("problems")
    ]
    first_wall = (runs[0].wall_seconds or 0.0) if runs else 0.0
    checks = targets(rows, first_wall)
    print(f"\n{'experiment':34} {'pass':>5} {'detect':>7} {'isolate':>7} {'recover':>7} {'p90 rec':>7} "
          f"{'floor':>6} {'ratio':>6}")
    for r in rows:
        m, fl = r["median_seconds"], r["floor_seconds"]
        ratio = r["ratio_to_floor"]["recover"]
        passed = f"{r['results'].count('met')}/{r['runs']}"
        print(f"{r['name']:34} {passed:>5} {_fmt(m['detect']):>7} {_fmt(m['isolate']):>7} "
              f"{_fmt(m['recover']):>7} {_fmt(r['p90_seconds']['recover']):>7} {_fmt(fl.get('recover')):>6} "
              f"{_fmt(ratio):>6}")
    print(f"\nsuites green: {green} of {len(runs)}")
    for h in healing:
        print(f"  healing before {h['before']} (run {h['run']}): {'; '.join(h['problems'])} -> "
              f"{'; '.join(h['actions']) or 'waited'} in {h['seconds']} s{'' if h['ok'] else ' (FAILED)'}")
    print(f"\nsuite wall time: {', '.join(f'{r.wall_seconds or 0:.0f} s' for r in runs)} "
          f"(first includes bring-up {(runs[0].setup_seconds or 0) if runs else 0:.0f} s)")
    for c in checks:
        flag = {True: "met", False: "MISSED", None: "not measured"}[c["met"]]
        print(f"  {c['target']}: {_fmt(c['value'])} ({flag})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "gameday",
        "stack": args.stack,
        "source": f"--from-reports {args.from_reports}" if args.from_reports is not None else "run",
        "note": args.note,
        "runs": len(runs),
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        },
        "total_seconds": total_s,
        "suite_wall_seconds": [r.wall_seconds for r in runs],
        "setup_seconds": [r.setup_seconds for r in runs],
        "experiments": rows,
        "targets": checks,
        "suites": [r.counts for r in runs],
        "suites_green": green,
        "healing": healing,
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
