"""`gpufleet upgrade plan`: the waves of a rolling driver or firmware upgrade (docs/fleet-upgrade.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gpufleet.cli.common import console, input_errors, print_json
from gpufleet.config import load_named_stack, load_stack
from gpufleet.core.errors import InputError, Problem
from gpufleet.fleet.upgrade import (
    Component,
    UpgradePlan,
    load_snapshot,
    plan_upgrade,
    snapshot_from_stack,
    with_protection,
)

# A driver (570.124.06), firmware (96.00.9F.00.04) or package version (2.19.3-1+cuda12.8): what a
# version string may hold, so a typo such as an empty string or a flag is refused before planning.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~:-]{0,63}$")

STACK_SOURCE_NOTE = (
    "Fleet snapshot: the stack's node pools, no live backend given. Current versions, cordons and "
    "running jobs are unknown, so every node is planned; a rollout needs a live snapshot (--snapshot)."
)

upgrade_app = typer.Typer(help="Rolling driver and firmware upgrades: canary, waves, gates, rollback.",
                          no_args_is_help=True)


def _version(value: str) -> str:
    if not _VERSION.match(value):
        raise typer.BadParameter(
            f"{value!r} is not a version (letters, digits and . _ + ~ : -, starting with a letter or digit)"
        )
    return value


def _names(nodes: tuple[str, ...], shown: int = 4) -> str:
    if len(nodes) <= shown:
        return ", ".join(nodes)
    return f"{', '.join(nodes[: shown - 1])}, ... {nodes[-1]}"


def print_plan(plan: UpgradePlan, stack_file: str) -> None:
    p = plan.policy
    title = f"[bold]Upgrade plan[/] {plan.component.value} -> {plan.target}  ({stack_file})"
    console.print(title, highlight=False)
    console.print(
        f"policy: canary {p.canary_nodes_per_pool}/pool, waves of {p.wave_size}, maxUnavailable "
        f"{p.max_unavailable}, bake {p.bake_seconds:g} s; timeouts: protected jobs "
        f"{p.protected_job_wait_seconds:g} s, drain {p.drain_timeout_seconds:g} s, reboot "
        f"{p.reboot_timeout_seconds:g} s, gate {p.gate_timeout_seconds:g} s",
        highlight=False,
    )
    table = Table(title_justify="left")
    for col in ("wave", "nodes", "first ... last"):
        table.add_column(col)
    for w in plan.waves:
        table.add_row("canary" if w.canary else str(w.index), str(len(w.nodes)), _names(w.nodes))
    console.print(table)
    console.print(
        f"planned {plan.planned_nodes} node(s) in {len(plan.waves)} wave(s); up to date "
        f"{len(plan.up_to_date)}; left out {len(plan.left_out)}",
        highlight=False,
    )
    for skip in plan.left_out:
        line = f"  left out {skip.node}: {skip.reason.value} ({skip.detail})"
        console.print(line, highlight=False, markup=False)
    if plan.source == "stack":
        console.print(f"[yellow]{STACK_SOURCE_NOTE}[/]", highlight=False)


@upgrade_app.command("plan")
@input_errors
def plan_cmd(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name or stack file")],
    to: Annotated[str, typer.Option("--to", help="Target version", callback=_version)],
    component: Annotated[Component, typer.Option("--component", help="What is upgraded")] = Component.DRIVER,
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", help="A fleet snapshot file (JSON/YAML: nodes, versions, cordons, jobs); "
                                        "default: the stack's node pools"),
    ] = None,
    stacks_dir: Annotated[Path, typer.Option("--stacks-dir", help="Where stack files live")] = Path("stacks"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
) -> None:
    """Plan a rolling upgrade: canary nodes per pool, then waves under the stack's `upgrade` policy;
    nodes cordoned by others or unhealthy are left out with their reason."""
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.exists():
        spec, stack_file = load_stack(p), str(p)
    else:
        spec, stack_file = load_named_stack(stack, stacks_dir), str(stacks_dir / f"Pulumi.{stack}.yaml")
    if snapshot is None:
        fleet = snapshot_from_stack(spec, component)
    else:
        fleet = load_snapshot(snapshot)
        if fleet.component is not component:
            message = (f"the snapshot observed the {fleet.component.value}, not the {component.value} "
                       "(--component)")
            raise InputError(str(snapshot), [Problem("component", message)])
    plan = plan_upgrade(with_protection(fleet, spec.upgrade), spec.upgrade, to)
    if as_json:
        doc = plan.to_doc()
        if plan.source == "stack":
            doc["note"] = STACK_SOURCE_NOTE
        print_json(doc)
    else:
        print_plan(plan, stack_file)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.add_typer(upgrade_app, name="upgrade")
