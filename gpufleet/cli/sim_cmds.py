"""`gpufleet simulate`: project the stack's reliability to full scale (docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from gpufleet.catalog import load_catalog
from gpufleet.cli.common import console, input_errors
from gpufleet.config import StackSpec, load_named_stack, load_stack
from gpufleet.sim import Study, load_report, load_scenario, resolve, run_study, write_study
from gpufleet.sim.stats import Estimate


def _load(stack: str, stacks_dir: Path) -> tuple[StackSpec, str]:
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return load_stack(p), str(p)
    return load_named_stack(stack, stacks_dir), str(stacks_dir / f"Pulumi.{stack}.yaml")


def _ci(e: Estimate, fmt: str = "{:.4f}") -> str:
    return f"{fmt.format(e.mean)}  [{fmt.format(e.low)}, {fmt.format(e.high)}]"


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
        days: float | None = typer.Option(None, "--days", min=0.001, help="horizon (default 54)"),
        runs: int = typer.Option(200, "--runs", min=1, help="Monte Carlo replications"),
        scenario: Path | None = typer.Option(None, "--scenario", help="scenario YAML (overrides)"),
        from_report: Path | None = typer.Option(None, "--from-report", help="game-day report JSON"),
        out: Path | None = typer.Option(None, "--out", help="output folder (default simulate-out/<cluster>)"),
        seed: int = typer.Option(1, "--seed", min=0),
        workers: int | None = typer.Option(None, "--workers", min=1, help="processes (default: all CPUs)"),
        pool: str | None = typer.Option(None, "--pool", help="node pool of the job (default: largest)"),
        recommend: bool = typer.Option(False, "--recommend", help="search interval and spares for SLOs"),
        plots: bool = typer.Option(True, "--plots/--no-plots"),
        stacks_dir: Path = typer.Option(Path("stacks"), "--stacks-dir"),
    ) -> None:
        """Project ETTR, interruptions, MTBF, lost time and availability at full scale."""
        spec, stack_file = _load(stack, stacks_dir)
        sc = load_scenario(scenario) if scenario is not None else None
        measured = load_report(from_report) if from_report is not None else None
        params = resolve(spec, load_catalog(), sc, scenario_file=str(scenario or "(scenario)"),
                         measured=measured, report_file=str(from_report or ""), days=days, pool=pool)
        inputs = {"stack": stack_file, "scenario": str(scenario or ""), "report": str(from_report or "")}
        study = run_study(params, seed, runs, workers=workers, ettr_target=spec.slos.ettr,
                          availability_target=spec.slos.availability, inputs=inputs,
                          do_recommend=recommend)
        print_study(study)
        target = out if out is not None else Path("simulate-out") / spec.cluster.name
        files = write_study(study, target, plots=plots)
        console.print(f"wrote {', '.join(str(f) for f in files)} ({study.elapsed_seconds:.1f} s)",
                      highlight=False)
