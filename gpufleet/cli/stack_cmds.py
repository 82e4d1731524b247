"""`gpufleet validate`: check a stack file against the stack model and the catalog's policy."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.catalog import OverrideSpec, load_catalog, xid_policy
from gpufleet.cli.common import console, input_errors
from gpufleet.config import load_stack
from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError


def check_stack_policy(stack: StackSpec, file: str) -> None:
    """Cross-check a stack's XID overrides against the catalog; raises InputError on conflicts."""
    overrides = {
        xid: OverrideSpec(o.action, o.reason, o.fault_class)
        for xid, o in stack.remediation.xid_overrides.items()
    }
    _, problems = xid_policy(load_catalog(), overrides)
    if problems:
        raise InputError(file, problems)


def register(app: typer.Typer) -> None:
    @app.command()
    @input_errors
    def validate(
        stack_file: Path = typer.Argument(..., help="Stack file, e.g. stacks/Pulumi.h200-ib.yaml"),
    ) -> None:
        """Validate a stack file: every problem is reported with its path; exit 2 if any."""
        stack = load_stack(stack_file)
        check_stack_policy(stack, str(stack_file))
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
