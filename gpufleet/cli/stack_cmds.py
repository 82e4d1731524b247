"""`gpufleet validate`: check a stack file against the stack model and the catalog's policy."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.cli.common import console, input_errors
from gpufleet.config import load_stack
from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError, Problem


def gameday_experiment_problems(stack: StackSpec, experiments_dir: Path) -> list[Problem]:
    """Every experiment the stack's game-day names must be a file `<experiments_dir>/<name>.json`
    (the game-day CronJob and `gpufleet gameday` run them by that name), written for the stack's
    game-day backend (tagged with its name: its probes fit that backend) and injecting only faults
    that backend can inject (its declared capabilities, gpufleet.chaos.backends)."""
    from gpufleet.chaos.backends.registry import backend_class
    from gpufleet.gameday.suite import load_experiment

    backend = stack.gameday.backend
    cls = backend_class(backend)
    catalog = load_catalog()
    names = stack.gameday.experiments
    problems = []
    for i, name in enumerate(names):
        path = experiments_dir / f"{name}.json"
        where = f"gameday.experiments[{i}]"
        if not path.is_file():
            known = sorted(p.stem for p in experiments_dir.glob("*.json") if p.is_file())
            listed = ", ".join(known) or f"none in {experiments_dir}"
            problems.append(Problem(where, f"no experiment file {path}; known: {listed}"))
            continue
        try:
            exp = load_experiment(path)
        except InputError as e:
            problems += [Problem(f"{where} ({path.name}): {p.path}", p.message) for p in e.problems]
            continue
        if backend not in exp.tags:
            tagged = sorted({t for t in exp.tags if t in ("sandbox", "slurm", "kubernetes")})
            ours = sorted(p.stem for p in experiments_dir.glob("*.json") if p.is_file()
                          and backend in load_experiment(p).tags)
            problems.append(Problem(
                where, f"{name} is written for {', '.join(tagged) or 'no backend'} (its tags), the stack's "
                f"game-day runs on {backend}: name one tagged {backend}: {', '.join(ours) or 'none exists'}",
            ))
        for fid in exp.fault_ids:
            try:
                injection = catalog.get(fid).injection_for(backend)
            except KeyError:
                problems.append(Problem(where, f"{name} injects {fid}, which is not in the catalog"))
                continue
            if injection is None:
                problems.append(Problem(where, f"{name} injects {fid}, which the catalog gives no injection"))
            elif not cls.can_inject(injection):
                problems.append(Problem(where, f"{name} injects {fid}: {cls.refusal(injection)}"))
    return problems


def check_stack_policy(stack: StackSpec, file: str) -> None:
    """Cross-check a stack's XID overrides against the catalog, and its remediation policy against
    what the platform deploys carries out (NVSentinel's settings); raises InputError on problems."""
    from gpufleet.config import Vendor
    from gpufleet.infra.monitoring import alert_routing_problems
    from gpufleet.infra.platform import vendors
    from gpufleet.infra.self_healing import remediation_problems

    _, problems = xid_policy(load_catalog(), stack.remediation.xid_overrides)
    problems += remediation_problems(stack.remediation, Vendor.NVIDIA in vendors(stack))
    problems += alert_routing_problems(stack)
    if problems:
        raise InputError(file, problems)


def register(app: typer.Typer) -> None:
    @app.command()
    @input_errors
    def validate(
        stack_file: Path = typer.Argument(..., help="Stack file, e.g. stacks/Pulumi.h200-ib.yaml"),
        experiments_dir: Path = typer.Option(
            Path("experiments"), "--experiments-dir", help="Where the game-day's experiment files are."
        ),
    ) -> None:
        """Validate a stack file: every problem is reported with its path; exit 2 if any. Also checks
        the catalog's XID policy against the stack's overrides, that every experiment the stack's
        game-day names exists, and that the stack's monitoring can meet each detect budget."""
        stack = load_stack(stack_file)
        check_stack_policy(stack, str(stack_file))
        from gpufleet.infra.monitoring import detection_budget_problems

        # A detect budget the stack's own monitoring cannot meet is refused, with every term of
        # the detection path (ADR 0044, 0046).
        problems = gameday_experiment_problems(stack, experiments_dir) + detection_budget_problems(stack)
        if problems:
            raise InputError(str(stack_file), problems)
        pools = ", ".join(
            f"{p.name}: {p.nodes}+{p.spares} x {p.gpus_per_node} {p.accelerator.value}"
            for p in stack.node_pools
        )
        console.print(
            f"[green]ok[/] {stack_file}: {stack.total_nodes} nodes, {stack.total_gpus} GPUs "
            f"({pools}); fabric {stack.fabric.kind.value} x{stack.fabric.rails_per_node}; "
            f"scheduler {stack.scheduler.kind.value}",
            highlight=False,
        )
