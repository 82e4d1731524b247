"""`gpufleet sandbox up|status|down|doctor`: the local sandbox cluster (docs/sandbox.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import console, fail, input_errors
from gpufleet.config.load import load_named_stack
from gpufleet.sandbox.doctor import diagnose
from gpufleet.sandbox.down import all_stacks, down
from gpufleet.sandbox.state import existing
from gpufleet.sandbox.status import status
from gpufleet.sandbox.up import SandboxError, UpOptions, require_root, up

sandbox_app = typer.Typer(
    help="The local sandbox cluster: namespaces, Slurm, Prometheus, training.", no_args_is_help=True
)

StackOpt = Annotated[str, typer.Option("--stack", "-s", help="stack name (stacks/Pulumi.<stack>.yaml)")]
StacksDirOpt = Annotated[Path, typer.Option("--stacks-dir", help="directory of the stack files")]


@sandbox_app.command("up")
@input_errors
def up_cmd(
    stack: StackOpt = "sandbox",
    stacks_dir: StacksDirOpt = Path("stacks"),
    rules: Annotated[
        list[Path] | None,
        typer.Option("--rules", help="Prometheus rule file(s); default: the repo's generated one"),
    ] = None,
    no_training: Annotated[
        bool, typer.Option("--no-training", help="do not submit the training job")
    ] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the sandbox to be ready")] = 180.0,
) -> None:
    """Build the sandbox of a stack and wait until every node is idle and training progresses."""
    spec = load_named_stack(stack, stacks_dir)
    try:
        rec, timings = up(
            stack,
            spec,
            UpOptions(rule_files=rules, training=not no_training, timeout_s=timeout),
            say=lambda m: console.print(m, highlight=False),
        )
    except (SandboxError, TimeoutError, RuntimeError, OSError) as e:
        raise fail(f"{e}\n(state kept for cleanup: run `gpufleet sandbox down --stack {stack}`)") from None
    st = rec.state
    console.print(
        f"sandbox [bold]{stack}[/] up (run {st.run_id}) in {timings.marks.get('up', 0):.1f} s: "
        f"{len(st.nodes) - 1} nodes, Prometheus {st.prometheus_url}, state {rec.path}",
        highlight=False,
    )


@sandbox_app.command("status")
def status_cmd(
    stack: StackOpt = "sandbox",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Show a sandbox: phase, processes, Slurm node states, training progress."""
    found = existing(stack)
    if found.error:
        raise fail(f"unreadable state file {found.error}")
    if found.state is None:
        raise fail(f"no sandbox for stack {stack!r}; start one with `gpufleet sandbox up --stack {stack}`")
    info = status(found.state)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"sandbox {info['stack']} run {info['run_id']}: phase {info['phase']}", highlight=False)
    console.print(f"  prometheus: {info['prometheus_url']}  base: {info['base_dir']}", highlight=False)
    dead = [n for n, ok in info["processes"].items() if not ok]
    console.print(
        f"  processes: {len(info['processes']) - len(dead)} running"
        + (f", NOT running: {', '.join(dead)}" if dead else ""),
        highlight=False,
    )
    for name, node in sorted(info["slurm_nodes"].items()):
        reason = f" ({node['reason']})" if node["reason"] else ""
        console.print(
            f"  {name}: {node['state']}{'' if node['responding'] else ' (not responding)'}{reason}",
            highlight=False,
        )
    if info["training"] is not None:
        t = info["training"]
        console.print(f"  training: step {t['max_step']}, restarts {t['restarts']}", highlight=False)


@sandbox_app.command("down")
def down_cmd(
    stack: StackOpt = "sandbox",
    all_: Annotated[bool, typer.Option("--all", help="every sandbox with a state file")] = False,
    keep_files: Annotated[bool, typer.Option("--keep-files", help="keep the run directory (logs)")] = False,
) -> None:
    """Remove exactly what `up` made (also after a crashed `up`). Idempotent."""
    try:
        require_root()
    except SandboxError as e:
        raise fail(str(e)) from None
    stacks = all_stacks() if all_ else [stack]
    bad = False
    for s in stacks:
        try:
            report = down(s, keep_files=keep_files)
        except RuntimeError as e:
            raise fail(str(e)) from None
        if report is None:
            console.print(f"no sandbox for stack {s!r}: nothing to do", highlight=False)
        elif report.clean:
            console.print(
                f"sandbox {s} (run {report.run_id}) removed; {report.stopped} processes stopped",
                highlight=False,
            )
        else:
            bad = True
            console.print(
                f"[red]sandbox {s} (run {report.run_id}) NOT fully removed[/]: "
                f"processes {report.left_processes}, network {report.network_errors}, "
                f"mounts {report.unmount_errors}; state kept, run `down` again",
                highlight=False,
            )
    if bad:
        raise typer.Exit(1)


@sandbox_app.command("doctor")
def doctor_cmd() -> None:
    """Check this machine for everything the sandbox needs; say how to get what is missing."""
    checks = diagnose()
    for c in checks:
        mark = "[green]ok[/]     " if c.ok else "[red]MISSING[/]"
        console.print(f"{mark} {c.name}: {c.detail}", highlight=False)
        if c.fix:
            console.print(f"        fix: {c.fix}", highlight=False, soft_wrap=True)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `gpufleet sandbox ...` to the app."""
    app.add_typer(sandbox_app, name="sandbox")
