"""`gpufleet generate [--check]`: alert rules, promtool tests, dashboard and runbooks from the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.catalog.generate import default_root, drift, outputs, write
from gpufleet.catalog.load import DATA_DIR, load_catalog
from gpufleet.catalog.promtests import load_fixtures
from gpufleet.catalog.runbooks import load_notes
from gpufleet.chaos.backends.registry import capabilities
from gpufleet.cli.common import console, err_console, input_errors


@input_errors
def generate(
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 naming every drifted file.")
    ] = False,
    root: Annotated[Path | None, typer.Option(help="Repository root (default: this checkout).")] = None,
    data_dir: Annotated[Path, typer.Option(help="Catalog data directory.", hidden=True)] = DATA_DIR,
) -> None:
    """Generate monitoring/ (rules, promtool tests, dashboard) and runbooks/ from the fault catalog."""
    base = root or default_root()
    expected = outputs(load_catalog(data_dir), load_fixtures(), load_notes(), capabilities())
    if check:
        drifted = drift(base, expected)
        for d in drifted:
            err_console.print(f"drift: {d.path} ({d.reason})", highlight=False)
        if drifted:
            err_console.print(f"{len(drifted)} generated file(s) out of date: run `gpufleet generate`",
                              highlight=False)
            raise typer.Exit(1)
        console.print(f"{len(expected)} generated files up to date", highlight=False)
        return
    changed = write(base, expected)
    for path in changed:
        console.print(f"wrote {path}", highlight=False)
    console.print(f"{len(expected)} generated files, {len(changed)} changed", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("generate")(generate)
