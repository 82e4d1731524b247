"""`gpufleet chaos ...`: the fault ledger (list, revert), discovery and experiment checks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gpufleet.cli.common import console, err_console, fail, print_input_error

if TYPE_CHECKING:
    from gpufleet.chaos.ledger import Ledger

chaos_app = typer.Typer(help="Chaos Toolkit extension: fault ledger, revert, checks.", no_args_is_help=True)

LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger", help="fault ledger: a file, or configmap://<namespace>/<name> (default: $GPUFLEET_LEDGER "
        "or /var/lib/gpufleet/ledger/faults.jsonl)"
    ),
]
StackOpt = Annotated[
    str | None,
    typer.Option("--stack", help="a ConfigMap ledger: through this stack's Kubernetes sandbox's API server"),
]
KubeconfigOpt = Annotated[
    str | None,
    typer.Option("--kubeconfig", help="a ConfigMap ledger: this kubeconfig (default: $KUBECONFIG, "
                 "~/.kube/config, else the pod's service account)"),
]


def _ledger(location: str | None, stack: str | None, kubeconfig: str | None) -> Ledger:
    """The ledger at `location`; a ConfigMap one through the Kubernetes API (the chaos backend's
    connection rules: --kubeconfig, else the stack's Kubernetes sandbox, else the defaults)."""
    from chaoslib.exceptions import InvalidActivity

    from gpufleet.chaos import engine
    from gpufleet.chaos.settings import ledger_location
    from gpufleet.core.ledger_location import configmap_location

    where = location or ledger_location({})
    cfg: dict[str, str] = {"gpufleet_ledger": where}
    try:
        if configmap_location(where) is not None:
            cfg["gpufleet_backend"] = "kubernetes"
            extra = (("gpufleet_stack", stack), ("gpufleet_kubeconfig", kubeconfig))
            cfg.update({k: v for k, v in extra if v})
        return engine.ledger_of(cfg)
    except (InvalidActivity, ValueError) as e:
        raise fail(f"--ledger {where}: {e}", code=2) from None


@chaos_app.command("revert")
def revert_cmd(
    ledger: LedgerOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run")] = False,
    stack: StackOpt = None,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Undo every fault still recorded in the ledger (after a crash or kill -9 of a run). Idempotent."""
    from gpufleet.chaos.ledger import revert_pending
    from gpufleet.chaos.rollbacks import ROLLBACKS

    led = _ledger(ledger, stack, kubeconfig)
    pending = led.pending()
    if not pending:
        console.print(f"nothing to revert in {led.where}")
        return
    if dry_run:
        for r in reversed(pending):
            console.print(f"would revert {r.id} {r.kind} {r.target} with {r.rollback.name}")
        return
    results = revert_pending(led, ROLLBACKS)
    for res in results:
        mark = "[green]reverted[/]" if res.ok else f"[red]FAILED[/] {res.error}"
        console.print(f"{mark} {res.record.id} {res.record.kind} {res.record.target}", highlight=False)
    if any(not r.ok for r in results):
        raise fail("some faults could not be reverted; they stay in the ledger (run again once fixed)")


@chaos_app.command("ledger")
def ledger_cmd(
    ledger: LedgerOpt = None,
    pending: Annotated[bool, typer.Option("--pending", help="only faults not yet reverted")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    stack: StackOpt = None,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """List the faults in the ledger."""
    led = _ledger(ledger, stack, kubeconfig)
    records = led.pending() if pending else led.records()
    reverted = {r.id: r for r in led.reverts() if r.ok}
    rows = [{**r.to_json(), "reverted_at": reverted[r.id].at if r.id in reverted else None} for r in records]
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["at"]))
        state = "reverted" if row["reverted_at"] else ("dry-run" if row["dry_run"] else "PENDING")
        console.print(
            f"{when} {row['id']} {state:8} {row['kind']:14} {row['target']} run={row['run_id']}",
            highlight=False,
        )


@chaos_app.command("steady")
def steady_cmd(
    stack: Annotated[str, typer.Option("--stack", help="the stack whose cluster to check")],
    backend: Annotated[str, typer.Option("--backend", help="sandbox | slurm | kubernetes")] = "sandbox",
    heal: Annotated[bool, typer.Option("--heal", help="restore the steady state: revert pending faults, "
                                       "restart dead daemons, resume nodes and training")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, max=1800,
                                           help="seconds --heal waits for the steady state")] = 120.0,
    stacks_dir: Annotated[Path, typer.Option("--stacks-dir")] = Path("stacks"),
) -> None:
    """Check the cluster's steady state (what an experiment's control requires before it runs):
    exit 0 when it holds, 1 when it does not; `--heal` restores it first (as the game-day does
    before each experiment)."""
    from chaoslib.exceptions import ActivityFailed, InvalidActivity

    from gpufleet.chaos import engine, steady

    cfg = {"gpufleet_backend": backend, "gpufleet_stack": stack, "gpufleet_stacks_dir": str(stacks_dir)}
    try:
        ctx = engine.context(cfg)
        if heal:
            report = steady.ensure(ctx.backend, ctx.ledger, timeout_s=timeout)
            for action in report.actions:
                console.print(f"healed: {escape(action)}", highlight=False)
            left = report.remaining if not report.ok else []
        else:
            left = steady.check(ctx.backend(), ctx.ledger)
    except (ActivityFailed, InvalidActivity) as e:
        raise fail(f"steady state unknown: {e}", code=2) from None
    if left:
        for problem in left:
            err_console.print(f"not steady: {escape(problem)}", highlight=False)
        raise typer.Exit(1)
    console.print(f"{stack}: steady state holds")


@chaos_app.command("discover-check")
def discover_check() -> None:
    """List every activity of the extension; fail if one has no docstring."""
    from gpufleet.chaos import discover

    acts = discover(discover_system=False)["activities"]
    missing = [f"{a['mod']}.{a['name']}" for a in acts if not (a.get("doc") or "").strip()]
    for a in acts:
        console.print(f"{a['type']:6} {a['mod']}.{a['name']}", highlight=False)
    if missing:
        raise fail(f"activities without documentation: {', '.join(missing)}")
    console.print(f"{len(acts)} activities, all documented")


@chaos_app.command("validate")
def validate_cmd(
    experiments: Annotated[list[Path], typer.Argument(help="experiment JSON files")],
    stacks_dir: Annotated[
        Path | None,
        typer.Option(
            "--stacks-dir", help="stack files (default: each experiment's gpufleet_stacks_dir, else stacks)"
        ),
    ] = None,
) -> None:
    """Check experiment files before a run: chaoslib's checks (those `chaos run` makes) and what only
    gpufleet knows: configuration keys and values, the stack, fault ids against the catalog (with
    an injection for the backend), fault classes, node selectors, GPU and rail indices within the
    stack, argument names and types. Every problem of every file; exit 2 if any file is invalid."""
    from chaoslib.exceptions import ChaosException
    from chaoslib.experiment import ensure_experiment_is_valid

    from gpufleet.chaos.checks import check_experiment
    from gpufleet.core.errors import InputError, Problem
    from gpufleet.core.inputs import read_json

    bad = 0
    for p in experiments:
        try:
            doc = read_json(p)
            problems: list[Problem] = []
            try:
                ensure_experiment_is_valid(doc)
            except (ChaosException, ValueError, TypeError, AttributeError, KeyError) as e:
                problems.append(Problem("(chaoslib)", str(e) or type(e).__name__))
            problems += check_experiment(doc, stacks_dir)
            if problems:
                raise InputError(str(p), problems)
        except InputError as e:
            bad += 1
            print_input_error(e)
        else:
            console.print(f"[green]valid[/] {escape(str(p))}", highlight=False)
    if bad:
        err_console.print(f"{bad} of {len(experiments)} experiment(s) invalid", highlight=False)
        raise typer.Exit(InputError.exit_code)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.add_typer(chaos_app, name="chaos")
