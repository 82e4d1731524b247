"""CLI commands of the health domain: `gpufleet node-health` (options: gpufleet/health/cli.py) and
`gpufleet gpu-reset` (gpufleet/health/gpu_reset.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import console, err_console, input_errors


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

    @app.command("gpu-reset")
    @input_errors
    def gpu_reset(
        pci: Annotated[list[str], typer.Argument(
            help="PCI address of each GPU to reset, e.g. 0000:18:00.0.")],
        mark_only: Annotated[bool, typer.Option(
            "--mark-only", help="The GPUs were reset by another tool: only record the resets.")] = False,
        kmsg: Annotated[Path, typer.Option(
            help="Where the mark goes: the kernel log (a file only for tests).")] = Path("/dev/kmsg"),
    ) -> None:
        """Reset NVIDIA GPUs (`nvidia-smi --gpu-reset`) and record each reset in the kernel log, so that
        node-health and `gpufleet inspect --here` count XIDs from the reset on, not from boot. Exit 0
        all reset and recorded, 1 one failed (no mark for it), 2 bad input."""
        from gpufleet.health.gpu_reset import check_inputs, reset_and_mark

        done = reset_and_mark(check_inputs(pci, kmsg), kmsg, mark_only=mark_only)
        for o in done:
            if o.error is None:
                console.print(f"GPU {o.pci}: {'recorded' if mark_only else 'reset and recorded'} in {kmsg}",
                              highlight=False)
            else:
                what = "reset, but not recorded" if o.reset else "not reset, not recorded"
                err_console.print(f"GPU {o.pci}: {what}: {o.error}", highlight=False, markup=False)
        raise typer.Exit(0 if all(o.error is None for o in done) else 1)
