"""`gpufleet catalog list|show|check`: browse and validate the fault catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.catalog.load import DATA_DIR, Catalog, load_catalog
from gpufleet.catalog.model import Fault, runbook_url
from gpufleet.catalog.rules import RUNBOOK_BASE, domain_of
from gpufleet.catalog.validate import load_path
from gpufleet.chaos.backends.registry import BACKEND_CLASSES
from gpufleet.cli.common import OutputFormat, OutputOpt, console, fail, input_errors, print_json
from gpufleet.core.tables import Col, fit_table
from gpufleet.core.taxonomy import FaultClass

catalog_app = typer.Typer(help="Browse and validate the fault catalog.", no_args_is_help=True)

DataDir = Annotated[
    Path, typer.Option("--data-dir", help="Catalog data directory (default: the built-in catalog).")
]


# `catalog list` columns; on a narrow terminal the lowest `drop` goes first: escalation and domain
# (the id says it), then the alert name, the XID (in the id of XID faults) and the severity. The id,
# class and action, what an operator looks up, always stay.
LIST_COLUMNS = (
    Col("id"),
    Col("domain", drop=1),
    Col("class"),
    Col("severity", drop=4),
    Col("XID", drop=3, justify="right"),
    Col("alert", drop=2),
    Col("action"),
    Col("escalation", drop=0),
)


def _escalation(f: Fault) -> str:
    e = f.escalation
    return f"{e.repeats}x/{e.window_hours:g}h -> {e.to.value}" if e else ""


def fault_row(f: Fault, catalog: Catalog) -> list[str]:
    return [f.id, domain_of(f, catalog), f.fault_class.value, f.severity.value, str(f.xid or ""),
            f.alert.name if f.alert else "(exempt)", f.action.value, _escalation(f)]


def fault_summary(f: Fault, catalog: Catalog) -> dict[str, Any]:
    """One fault as `catalog list --output json` prints it."""
    e = f.escalation
    return {
        "id": f.id, "title": f.title, "domain": domain_of(f, catalog), "class": f.fault_class.value,
        "severity": f.severity.value, "xid": f.xid, "alert": f.alert.name if f.alert else None,
        "action": f.action.value,
        "escalation": {"repeats": e.repeats, "window_hours": e.window_hours, "to": e.to.value} if e else None,
    }


@catalog_app.command("list")
@input_errors
def list_faults(
    fault_class: Annotated[
        FaultClass | None, typer.Option("--class", help="Only faults of this class.")
    ] = None,
    data_dir: DataDir = DATA_DIR,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List the faults of the catalog (the columns that fit the terminal; --output json has all)."""
    catalog = load_catalog(data_dir)
    faults = [f for f in catalog if fault_class is None or f.fault_class is fault_class]
    if output is OutputFormat.JSON:
        print_json([fault_summary(f, catalog) for f in faults])
        return
    rows = [fault_row(f, catalog) for f in faults]
    # Cells are plain text: markup in catalog data (e.g. "[secondary]") must print as written.
    table = fit_table(LIST_COLUMNS, [[_escape(c) for c in r] for r in rows], console.width,
                      title=f"Fault catalog ({len(faults)} of {len(catalog)})")
    console.print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@catalog_app.command("show")
@input_errors
def show(fault_id: Annotated[str, typer.Argument(help="Fault id, e.g. gpu-xid-79.")],
         data_dir: DataDir = DATA_DIR, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Show one fault in full."""
    catalog = load_catalog(data_dir)
    try:
        f = catalog.get(fault_id)
    except KeyError as missing:
        raise fail(str(missing.args[0])) from None
    if output is OutputFormat.JSON:
        doc = f.model_dump(mode="json", by_alias=True, exclude_none=True)
        doc.update(domain=domain_of(f, catalog), source_file=catalog.sources.get(f.id, ""))
        if f.alert:
            doc["runbook_url"] = runbook_url(f.alert.name, RUNBOOK_BASE)
        print_json(doc)
        return
    console.print(f"[bold]{f.id}[/] - {f.title}", highlight=False)
    rows: list[tuple[str, str]] = [
        ("class", f.fault_class.value), ("severity", f.severity.value), ("domain", domain_of(f, catalog)),
        ("source file", catalog.sources.get(f.id, "")),
    ]
    if f.xid is not None:
        rows.append(("XID", f"{f.xid}" + (f" (DCGM health {f.dcgm_health})" if f.dcgm_health else "")))
    rows.append(("action", f.action.value))
    if f.escalation:
        e = f.escalation
        rows.append(("escalation", f"{e.repeats} times in {e.window_hours:g} h -> {e.to.value}"))
    if f.dedup:
        rows.append(("dedup", f"window {f.dedup.window_seconds:g} s"
                     + (f", secondary to {', '.join(f.dedup.secondary_to)}" if f.dedup.secondary_to else "")))
    if f.alert:
        rows += [("alert", f"{f.alert.name} (for {f.alert.for_})"), ("summary", f.alert.summary),
                 ("runbook", runbook_url(f.alert.name, RUNBOOK_BASE))]
    else:
        rows.append(("exemption", f.exemption or ""))
    if f.health_check:
        rows.append(("health check", f.health_check.model_dump_json(exclude_none=True, by_alias=True)))
    if f.injection is not None:
        rows.append(("inject", f.injection.describe()))
        for backend, inj in sorted(f.injection_overrides.items()):
            rows.append((f"inject ({backend})", inj.describe()))
        able = [name for name, cls in sorted(BACKEND_CLASSES.items())
                if (given := f.injection_for(name)) is not None and cls.can_inject(given)]
        rows.append(("injectable on", ", ".join(able) or "no backend (see docs/chaos.md)"))
    if f.rate:
        r = f.rate
        value = (f"{r.per_million_gpu_hours:g} per 1M GPU-h" if r.per_million_gpu_hours is not None
                 else f"{r.per_thousand_node_days:g} per 1k node-days")
        rows.append(("rate", f"{value} x share {r.share:g} - {r.cause}; {r.source}"))
    table = Table(show_header=False, box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, _escape(v))
    console.print(table)
    if f.alert:
        console.print(f.alert.expr, highlight=False, markup=False)


@catalog_app.command("check")
@input_errors
def check(
    path: Annotated[Path, typer.Argument(help="Catalog directory or file to validate.")] = DATA_DIR,
) -> None:
    """Validate a catalog directory or file (every entry, cross-references); exit 2 if invalid."""
    catalog = load_path(path)
    alerts = sum(1 for f in catalog if f.alert)
    console.print(f"{path}: {len(catalog)} faults, {alerts} alerts, valid", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.add_typer(catalog_app, name="catalog")
