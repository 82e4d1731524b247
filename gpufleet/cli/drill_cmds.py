"""`gpufleet drill list | run <name>`: disaster-recovery drills with RPO/RTO verdicts (docs/storage.md).

Each drill is a Chaos Toolkit experiment in `experiments/drills/`; `run` plays it with plain
`chaos run --rollback-strategy=always` against the stack's storage sandbox and prints the verdict
its probe `drill_within_targets` wrote into the journal (judged once, by gpufleet.slo.dr; nothing
is judged again here). Exit 0 only for PASS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.common import console, fail
from gpufleet.slo.dr import DrillVerdict

drill_app = typer.Typer(help="Disaster-recovery drills with RPO/RTO verdicts.", no_args_is_help=True)
VERDICT_PROBE = "drill-within-targets"
DirOpt = Annotated[Path, typer.Option("--drills-dir", help="folder of the drill experiments")]


def _drills(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(folder.glob("*.json")):
        try:
            out[p.stem] = json.loads(p.read_text())
        except ValueError as e:
            raise fail(f"{p}: not JSON: {e}", code=2) from None
    return out


@drill_app.command("list")
def list_cmd(drills_dir: DirOpt = Path("experiments/drills")) -> None:
    """The drills and what each one does."""
    drills = _drills(drills_dir)
    if not drills:
        raise fail(f"no drills in {drills_dir}", code=2)
    for name, doc in drills.items():
        console.print(f"[bold]{name}[/]: {doc.get('title', '')}", highlight=False)


def verdict_from_journal(journal: dict[str, Any]) -> DrillVerdict | None:
    """The verdict the drill's probe returned after the method (None when it never ran)."""
    after = (journal.get("steady_states") or {}).get("after") or {}
    for probe in after.get("probes") or []:
        if (probe.get("activity") or {}).get("name") == VERDICT_PROBE and isinstance(
            probe.get("output"), dict
        ):
            try:
                return DrillVerdict.from_doc(probe["output"])
            except ValueError:
                return None
    return None


@drill_app.command("run")
def run_cmd(
    name: Annotated[str, typer.Argument(help="the drill (see `gpufleet drill list`)")],
    stack: Annotated[str, typer.Option("--stack", "-s", help="stack whose storage sandbox to drill")] = (
        "sandbox-storage"
    ),
    drills_dir: DirOpt = Path("experiments/drills"),
    journal: Annotated[Path | None, typer.Option("--journal", help="where to write the journal")] = None,
) -> None:
    """Run one drill with `chaos run` and print its RPO/RTO verdict; exit 1 unless it PASSES."""
    path = drills_dir / f"{name}.json"
    if not path.exists():
        known = ", ".join(_drills(drills_dir)) or "none"
        raise fail(f"no drill {name!r} in {drills_dir} (known: {known})", code=2)
    journal = journal or Path(f"drill-{name}-{time.strftime('%Y%m%dT%H%M%S')}.json")
    chaos = os.environ.get("GPUFLEET_CHAOS_BIN") or str(Path(sys.executable).parent / "chaos")
    argv = [
        chaos,
        "--log-file",
        str(journal.with_suffix(".log")),
        "run",
        "--rollback-strategy=always",
        "--journal-path",
        str(journal),
        "--var",
        f"gpufleet_stack={stack}",
        str(path),
    ]
    console.print(f"drill {name} on stack {stack}: {' '.join(argv)}", highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    proc = subprocess.run(argv, check=False)
    try:
        doc = json.loads(journal.read_text())
    except (OSError, ValueError) as e:
        raise fail(f"`chaos run` wrote no readable journal (exit {proc.returncode}): {e}") from None
    verdict = verdict_from_journal(doc)
    console.print(
        f"chaos run: {doc.get('status')} in {time.monotonic() - t0:.1f} s; journal {journal}", highlight=False
    )
    if verdict is None:
        raise fail("the drill's verdict probe did not run after the method: no verdict (see the journal)")
    for c in verdict.checks:
        measured = "-" if c.measured is None else f"{c.measured:g}"
        target = "-" if c.budget is None else f"{c.budget:g}"
        console.print(
            f"  {c.name:<10} {c.outcome.value:<8} measured {measured:<8} target {target:<6} {c.detail}",
            highlight=False,
        )
    if verdict.steps_lost is not None:
        console.print(f"  work lost: {verdict.steps_lost} steps", highlight=False)
    if verdict.resumed_after_seconds is not None:
        console.print(
            f"  the workload resumed (its first new save or step) {verdict.resumed_after_seconds:.1f} s "
            "after the failure",
            highlight=False,
        )
    for note in verdict.notes:
        console.print(f"  note: {note}", highlight=False)
    console.print(f"[bold]{name}: {verdict.outcome.value}[/]", highlight=False)
    if verdict.outcome.value != "PASS":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(drill_app, name="drill")
