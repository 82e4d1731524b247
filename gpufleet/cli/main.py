"""Entry point of the `gpufleet` command. Each domain registers its commands from its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import (
    bundle_cmds,
    catalog_cmds,
    chaos_cmds,
    drill_cmds,
    gameday_cmds,
    generate_cmds,
    health_cmds,
    inspect_cmds,
    preview_cmds,
    sandbox_cmds,
    sim_cmds,
    stack_cmds,
    upgrade_cmds,
)

app = typer.Typer(
    name="gpufleet",
    help="Declare GPU training clusters as code and prove their recovery targets with chaos.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)



def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"gpufleet {version('gpufleet')}")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """gpufleet: stacks, fault catalog, sandbox, chaos game-days and reliability simulation."""


for module in (
    stack_cmds,
    catalog_cmds,
    generate_cmds,
    preview_cmds,
    health_cmds,
    inspect_cmds,
    sandbox_cmds,
    chaos_cmds,
    gameday_cmds,
    drill_cmds,
    sim_cmds,
    upgrade_cmds,
    bundle_cmds,
):
    module.register(app)


if __name__ == "__main__":
    app()
