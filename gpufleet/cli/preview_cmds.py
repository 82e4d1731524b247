"""`gpufleet preview --stack <name>`: what the Pulumi program declares for a stack, computed
offline under Pulumi's mock runtime (no Pulumi CLI, no cluster, no state)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.common import OutputFormat, OutputOpt, console, err_console, input_errors, print_json
from gpufleet.config import load_named_stack
from gpufleet.core.inputs import check_output_file
from gpufleet.infra.offline import OfflinePreview, run_offline

OFFLINE_NOTE = (
    "OFFLINE VIEW: the Pulumi program was run under Pulumi's mock runtime. Nothing was compared "
    "with a cluster or a Pulumi state and no provider checked the inputs; run `pulumi preview -s "
    "{stack}` with the Pulumi CLI for the real diff."
)


def summary_rows(view: OfflinePreview) -> list[tuple[str, str]]:
    out = view.outputs
    fabric = out.get("fabric", {})
    return [
        ("cluster", f"{out.get('cluster')} ({out.get('environment')})"),
        ("GPUs", f"{out.get('gpus')} on {out.get('nodes')} nodes"),
        ("peak dense BF16", f"{out.get('peakBf16Pflops')} PFLOPS"),
        (
            "fabric",
            f"{fabric.get('kind')} / {fabric.get('mode')}, {fabric.get('railsPerNode')} rails x "
            f"{fabric.get('linkSpeedGbps')} Gb/s, RDMA resource {fabric.get('rdmaResource')}",
        ),
        ("scheduler", str(out.get("scheduler"))),
        (
            "alerts",
            f"{out.get('alerts')} (PrometheusRule CRs: "
            f"{view.by_type().get('kubernetes:monitoring.coreos.com/v1:PrometheusRule', 0)})",
        ),
        ("game-day", str(out.get("gamedaySchedule"))),
        ("resources", f"{len(view.custom())} in {len(view.resources) - len(view.custom())} components"),
    ]


def slo_rows(slos: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [
        (k, str(slos[k])) for k in ("availability", "maxJobInterruptionShare", "ettr") if k in slos
    ]
    for fault_class, b in sorted(slos.get("budgets", {}).items()):
        iso = b.get("isolateSeconds")
        rows.append(
            (
                f"budget {fault_class}",
                f"detect {b['detectSeconds']:g} s, isolate "
                f"{'-' if iso is None else f'{iso:g} s'}, recover {b['recoverSeconds']:g} s",
            )
        )
    return rows


def _table(title: str, headers: tuple[str, str], rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=any(headers))
    table.add_column(headers[0])
    table.add_column(headers[1], overflow="fold")
    for a, b in rows:
        table.add_row(a, b)
    return table


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    @input_errors
    def preview(
        stack: str = typer.Option(..., "--stack", "-s", help="Stack name: stacks/Pulumi.<stack>.yaml"),
        json_file: Path | None = typer.Option(None, "--json", help="Write the declared resources here"),
        stacks_dir: Path = typer.Option(Path("stacks"), "--stacks-dir", help="Folder of stack files"),
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Offline view of what `pulumi up` would declare for a stack (Pulumi mock runtime)."""
        spec = load_named_stack(stack, stacks_dir)
        if json_file is not None:
            check_output_file(json_file, "--json")
        view = run_offline(spec, stack)
        if output is OutputFormat.JSON:
            print_json({
                "offline": True,
                "note": OFFLINE_NOTE.format(stack=stack),
                "stack": stack,
                "outputs": view.outputs,
                "resources_by_type": dict(sorted(view.by_type().items())),
                "resources_by_component": dict(sorted(view.by_component().items())),
            })
        else:
            _print_tables(stack, view)
        if json_file is not None:
            json_file.parent.mkdir(parents=True, exist_ok=True)
            json_file.write_text(json.dumps(view.to_json(), indent=1, sort_keys=True, default=str) + "\n")
            (console if output is OutputFormat.TABLE else err_console).print(
                f"wrote {json_file} ({len(view.resources)} entries; secret inputs shown as [secret])",
                markup=False,
                highlight=False,
            )


def _print_tables(stack: str, view: OfflinePreview) -> None:
    console.print(f"[bold yellow]{OFFLINE_NOTE.format(stack=stack)}[/]", highlight=False)
    console.print(_table(f"stack {stack}", ("", ""), summary_rows(view)))
    by_type = [(t, str(n)) for t, n in sorted(view.by_type().items(), key=lambda x: (-x[1], x[0]))]
    console.print(_table("resources by type", ("type", "count"), by_type))
    by_comp = [(t, str(n)) for t, n in sorted(view.by_component().items(), key=lambda x: (-x[1], x[0]))]
    console.print(_table("resources by component", ("component", "count"), by_comp))
    console.print(
        _table("reliability targets (SLOs)", ("target", "value"), slo_rows(view.outputs["slos"]))
    )
