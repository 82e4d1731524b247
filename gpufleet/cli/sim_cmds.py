"""`gpufleet simulate`: project the stack's reliability to full scale (docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.catalog import load_catalog
from gpufleet.cli.common import (
    OutputFormat,
    OutputOpt,
    console,
    err_console,
    input_errors,
    print_json,
)
from gpufleet.config import StackSpec, load_named_stack, load_stack
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import check_output_dir, read_json
from gpufleet.sim import SimParams, Study, load_scenario, parse_report, resolve, run_study, write_study
from gpufleet.sim.stats import Estimate
from gpufleet.sim.study import AUTO_MAX_RUNS, CALIBRATION, DEFAULT_PRECISION, MIN_PRECISE_RUNS

# Bounds of the numeric options: a typo (`--days 1e9`) must be refused at once, not run for hours.
# MAX_DAYS: ten years, more than a GPU server's service life (3-5 years); the catalog's failure rates
# describe servers in service, not beyond. MAX_RUNS: the 95% intervals narrow as 1/sqrt(runs), so
# beyond 100,000 runs they stop changing in the digits printed.
MAX_DAYS = 3650.0
MAX_RUNS = 100_000
MAX_WORKERS = 1024
# The cost of a study grows with GPUs x days x runs (faults happen per GPU-hour). Reference: 200 runs
# of 54 days at 16,384 GPUs take ~6.6 s on 2 cores (docs/simulator.md); a hundred times that, about
# ten minutes there, is the most one command may ask for.
MAX_GPU_DAYS = 100 * 200 * 54 * 16_384


def _load(stack: str, stacks_dir: Path) -> tuple[StackSpec, str]:
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return load_stack(p), str(p)
    return load_named_stack(stack, stacks_dir), str(stacks_dir / f"Pulumi.{stack}.yaml")


def _ci(e: Estimate, fmt: str = "{:.4f}") -> str:
    return f"{fmt.format(e.mean)}  [{fmt.format(e.low)}, {fmt.format(e.high)}]"


def _ci_doc(e: dict[str, Any]) -> str:
    """An estimate as the study document holds it."""
    return _ci(Estimate(e["mean"], e["ci95_low"], e["ci95_high"], e["runs"]))


def check_size(params: SimParams, runs: int, where: str) -> None:
    """Refuse a study beyond MAX_DAYS or MAX_GPU_DAYS, whichever input set the horizon."""
    problems = []
    if params.days > MAX_DAYS:
        problems.append(Problem("days", f"{params.days:g} days is more than the {MAX_DAYS:g} allowed"))
    cost = params.days * runs * params.job_gpus
    if cost > MAX_GPU_DAYS:
        problems.append(Problem(
            "runs x days x GPUs",
            f"{runs:,} runs x {params.days:g} days x {params.job_gpus:,} GPUs = {cost:.3g} GPU-days, more "
            f"than the {MAX_GPU_DAYS:.3g} one command may simulate (about ten minutes on 2 cores); "
            "lower --runs or --days",
        ))
    if problems:
        raise InputError(where, problems)


def print_study(s: Study) -> None:
    p, m = s.params, s.metrics
    console.print(
        f"[bold]{p.job_gpus:,} GPUs[/] ({p.job_nodes:,} x {p.gpus_per_node} {p.accelerator}, pool "
        f"{p.pool}) + {p.spares} {p.spare_mode} spares, {p.days:g} days, {s.runs} runs, seed {s.seed}; "
        f"faults {p.per_gpu_hour_total() * 1e6:.2f} per 1M GPU-h; checkpoint every "
        f"{p.checkpoint_interval_seconds / 60:g} min (write {p.checkpoint_write_seconds:g} s); "
        f"restart {p.restart_seconds:.0f} s",
        highlight=False,
    )
    t = Table(title="Projected reliability (mean, 95% CI)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    ok = "[green]meets[/]" if m.ettr.low >= s.ettr_target else "[red]misses[/]"
    t.add_row("ETTR", _ci(m.ettr), f">= {s.ettr_target:g} {ok}")
    t.add_row("job interruptions per day", _ci(m.interruptions_per_day, "{:.2f}"), "")
    t.add_row("interruptions per run", _ci(m.interruptions, "{:.1f}"), "")
    t.add_row("job MTBF (hours)", _ci(m.mtbf_hours, "{:.2f}"), "")
    t.add_row("node availability", _ci(m.node_availability, "{:.5f}"), "")
    cap_met = m.job_capacity_availability.low >= s.availability_target
    cap_ok = "[green]meets[/]" if cap_met else "[red]misses[/]"
    t.add_row("job capacity availability", _ci(m.job_capacity_availability, "{:.5f}"),
              f">= {s.availability_target:g} {cap_ok}")
    t.add_row("P(spares exhausted)", _ci(m.spares_exhausted, "{:.3f}"), "")
    t.add_row("circuit-breaker trips per run", _ci(m.breaker_trips, "{:.2f}"), "")
    console.print(t)
    lost = Table(title="Lost GPU-hours per run by cause (top 8)")
    lost.add_column("cause")
    lost.add_column("GPU-hours", justify="right")
    for cause, e in list(m.lost_gpu_hours_by_cause.items())[:8]:
        lost.add_row(cause, _ci(e, "{:,.0f}"))
    console.print(lost)
    if s.sensitivity:
        # What a projected ETTR depends on besides the rates (the full table: simulate.md).
        sens = Table(title="ETTR sensitivity (mean, 95% CI)")
        sens.add_column("parameter")
        sens.add_column("value", justify="right")
        sens.add_column("ETTR", justify="right")
        for row in s.sensitivity["detection"]:
            sens.add_row("detection", row["mode"], _ci_doc(row["ettr"]))
        for pt in s.by_interval:
            if pt.x in (5.0, 10.0, 30.0, 60.0):
                sens.add_row("checkpoint interval", f"{pt.x:g} min", _ci(pt.ettr))
        for row in s.sensitivity["checkpoint_write"]:
            sens.add_row("checkpoint write", f"{row['write_seconds']:g} s", _ci_doc(row["ettr"]))
        console.print(sens)
    console.print(f"Calibration: {CALIBRATION}", highlight=False)
    if s.recommended:
        if s.best is None:
            console.print("[red]No checkpoint interval / spare count in the search meets the SLOs.[/]")
        else:
            b = s.best
            console.print(
                f"[bold green]Recommendation:[/] checkpoint every {b.interval_minutes:g} min, "
                f"{b.spares} spares -> ETTR {_ci(b.ettr)}, "
                f"{b.cost:.4f} GPU-hours per useful GPU-hour", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("simulate")
    @input_errors
    def simulate(
        stack: str = typer.Option(..., "--stack", help="stack name (stacks/Pulumi.<s>.yaml) or file"),
        days: float | None = typer.Option(
            None, "--days", min=0.001, max=MAX_DAYS, help=f"horizon (default 54, at most {MAX_DAYS:g})"
        ),
        runs: int | None = typer.Option(
            None, "--runs", min=1, max=MAX_RUNS, help=f"Monte Carlo replications, exactly (at most "
            f"{MAX_RUNS:,}); default: as many as --precision needs, {MIN_PRECISE_RUNS} to {AUTO_MAX_RUNS}"
        ),
        precision: float = typer.Option(
            DEFAULT_PRECISION, "--precision", min=0.0001, max=0.5,
            help="without --runs: stop once the ETTR's 95% interval is within +/- this",
        ),
        scenario: Path | None = typer.Option(None, "--scenario", help="scenario YAML (overrides)"),
        from_report: Path | None = typer.Option(None, "--from-report", help="game-day report JSON"),
        out: Path | None = typer.Option(None, "--out", help="output folder (default simulate-out/<cluster>)"),
        seed: int = typer.Option(1, "--seed", min=0, max=2**63 - 1),
        workers: int | None = typer.Option(
            None, "--workers", min=1, max=MAX_WORKERS, help="processes (default: all CPUs)"
        ),
        pool: str | None = typer.Option(None, "--pool", help="node pool of the job (default: largest)"),
        recommend: bool = typer.Option(False, "--recommend", help="search interval and spares for SLOs"),
        plots: bool = typer.Option(True, "--plots/--no-plots"),
        stacks_dir: Path = typer.Option(Path("stacks"), "--stacks-dir"),
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Project ETTR, interruptions, MTBF, lost time and availability at full scale. Every input
        is checked before the simulation starts; --output json prints simulate.json's document."""
        spec, stack_file = _load(stack, stacks_dir)
        target = out if out is not None else Path("simulate-out") / spec.cluster.name
        check_output_dir(target, "--out")
        sc = load_scenario(scenario) if scenario is not None else None
        measured = parse_report(read_json(from_report), str(from_report)) if from_report is not None else None
        params = resolve(spec, load_catalog(), sc, scenario_file=str(scenario or "(scenario)"),
                         measured=measured, report_file=str(from_report or ""), days=days, pool=pool)
        most = runs if runs is not None else AUTO_MAX_RUNS
        check_size(params, most, "--days" if days is not None else str(scenario or stack_file))
        inputs = {"stack": stack_file, "scenario": str(scenario or ""), "report": str(from_report or "")}
        how = f"{runs:,} runs" if runs is not None else f"up to {most:,} runs (ETTR +/- {precision:g})"
        what = f"simulating {how} of {params.days:g} days at {params.job_gpus:,} GPUs"
        # The spinner goes to stderr and only on a terminal: stdout stays clean for --output json.
        what += " and searching for the SLOs" if recommend else ""
        with err_console.status(what) as status:

            def progress(stage: str, done: int, total: int) -> None:  # replications finished, per stage
                status.update(f"{what}: {stage} {done:,} of {total:,}")

            study = run_study(params, seed, most, precision=None if runs is not None else precision,
                              workers=workers, ettr_target=spec.slos.ettr,
                              availability_target=spec.slos.availability, inputs=inputs,
                              do_recommend=recommend, progress=progress)
        files = write_study(study, target, plots=plots)
        wrote = f"wrote {', '.join(str(f) for f in files)} ({study.elapsed_seconds:.1f} s)"
        if output is OutputFormat.JSON:
            print_json(study.as_dict())
            err_console.print(wrote, highlight=False)
            return
        print_study(study)
        console.print(wrote, highlight=False)
