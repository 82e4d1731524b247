"""`gpufleet gameday`: run the chaos suite against a stack and report verdicts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import OutputFormat, OutputOpt, console, err_console, fail, input_errors, print_json
from gpufleet.core.inputs import check_output_dir

BACKENDS = ("sandbox", "slurm", "kubernetes")


@input_errors
def gameday(
    stack: Annotated[str, typer.Option(help="Stack name: stacks/Pulumi.<stack>.yaml.")],
    backend: Annotated[
        str | None, typer.Option(help="sandbox | slurm | kubernetes (default: the stack's gameday.backend).")
    ] = None,
    experiments: Annotated[
        str | None, typer.Option(help="Comma-separated experiment names (file stems) to run, in order.")
    ] = None,
    report: Annotated[
        Path, typer.Option(help="Directory for summary.json, junit.xml, report.html, journals.")
    ] = Path("reports/gameday"),
    keep_sandbox: Annotated[bool, typer.Option(help="Leave a sandbox this run brought up running.")] = False,
    experiments_dir: Annotated[
        Path, typer.Option(help="Where the experiment files are.")
    ] = Path("experiments"),
    stacks_dir: Annotated[Path, typer.Option(help="Where the stack files are.")] = Path("stacks"),
    timeout: Annotated[
        float, typer.Option(help="Seconds one experiment may take, rollbacks included.", min=1, max=86_400)
    ] = 300.0,
    nodes: Annotated[
        int | None,
        typer.Option(help="Kubernetes backend on a sandbox stack: the Kubernetes sandbox's node count "
                     "(`sandbox up --kubernetes --nodes`); default: the stack's pools.", min=1, max=5000),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run the game-day suite one experiment at a time, judge every run against the stack's
    recovery budgets and write the report. Exit 0: every target met; 1: a target missed (or a
    rollback failed); 3: a run could not be judged; 2: bad input. With --output json, progress goes
    to stderr and stdout gets summary.json's document."""
    from gpufleet.config import load_named_stack
    from gpufleet.gameday import GamedayOptions, run_gameday, write_report
    from gpufleet.gameday.console import RichListener, explain, verdict_table

    check_output_dir(report, "--report")
    spec = load_named_stack(stack, stacks_dir)
    chosen = backend or spec.gameday.backend
    if chosen not in BACKENDS:
        raise fail(f"--backend must be one of {', '.join(BACKENDS)} (got {chosen!r})", 2)
    if chosen == "sandbox" and os.geteuid() != 0:
        raise fail("the sandbox backend needs root (network namespaces, Slurm daemons)", 2)
    if nodes is not None and chosen != "kubernetes":
        raise fail("--nodes sizes the Kubernetes sandbox: it needs --backend kubernetes", 2)
    names = tuple(n.strip() for n in (experiments or "").split(",") if n.strip())
    opts = GamedayOptions(
        stack=stack, backend=chosen, experiments=names, report_dir=report, keep_sandbox=keep_sandbox,
        experiments_dir=experiments_dir, stacks_dir=stacks_dir, experiment_timeout_s=timeout,
        kube_nodes=nodes,
    )
    as_json = output is OutputFormat.JSON
    try:
        with RichListener(err_console if as_json else console) as listener:
            run = run_gameday(opts, listener)
    except RuntimeError as e:
        raise fail(str(e), 3) from None
    paths = write_report(run, report)
    if as_json:
        from gpufleet.gameday.report.summary import summary_dict

        print_json(summary_dict(run))
    else:
        console.print(verdict_table(run, console.width))
    for line in explain(run):
        err_console.print(f"  {line}", highlight=False, soft_wrap=True)
    if not run.results:
        err_console.print(f"no experiment is tagged {chosen!r} in {experiments_dir}", highlight=False)
    (err_console if as_json else console).print(
        f"report: {paths['html']}  summary: {paths['summary']}  junit: {paths['junit']}", highlight=False
    )
    raise typer.Exit(run.exit_code)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("gameday")(gameday)
