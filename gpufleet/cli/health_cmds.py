"""CLI commands of the health domain: `gpufleet node-health` (options: gpufleet/health/cli.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command(
        "node-health",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def node_health(ctx: typer.Context) -> None:
        """Check this node (DCGM/NVML or the sandbox agent, kernel log, fabric links) against the
        catalog's policy. Exit 0 OK, 1 problem, 2 unknown (node-problem-detector plugin contract);
        --slurm-drain drains the node. `gpufleet node-health --help` lists the options."""
        from gpufleet.health.cli import run

        raise typer.Exit(run(list(ctx.args)))
