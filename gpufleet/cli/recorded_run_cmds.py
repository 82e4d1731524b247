"""What `sandbox status` and `sandbox down` print for the sandboxes that record their run in a
state file of their own (--kubernetes, --storage): finding the run, its processes, taking it down.
Each kind adds only its own lines."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpufleet.cli.common import console, fail
from gpufleet.sandbox.run_teardown import RunDownReport

S = TypeVar("S")


@dataclass(frozen=True)
class RunKind:
    title: str  # "Kubernetes sandbox"
    flag: str  # "--kubernetes"


def require_run(kind: RunKind, stack: str, existing: Callable[[str], tuple[S | None, str | None]]) -> S:
    """The stack's recorded run, or exit with why there is none."""
    state, error = existing(stack)
    if error:
        raise fail(f"unreadable state file {error}")
    if state is None:
        raise fail(
            f"no {kind.title} for stack {stack!r}; "
            f"start one with `gpufleet sandbox up {kind.flag} --stack {stack}`"
        )
    return state


def print_header(kind: RunKind, info: dict[str, Any]) -> None:
    title = f"{kind.title} {info['stack']} run {info['run_id']}"
    console.print(f"{title}: phase {info['phase']}", highlight=False)


def print_processes(info: dict[str, Any]) -> None:
    """The processes line of a status: how many run, their resident memory, which do not run."""
    dead = [n for n, ok in info["processes"].items() if not ok]
    rss = sum(info["rss_bytes"].values()) / 2**20
    console.print(
        f"  processes: {len(info['processes']) - len(dead)} running, {rss:.0f} MiB resident"
        + (f", NOT running: {', '.join(dead)}" if dead else ""),
        highlight=False,
    )


def take_down(
    kind: RunKind,
    stacks: Iterable[str],
    down: Callable[[str], RunDownReport | None],
    errors: type[Exception],
    quiet_if_none: bool = False,
) -> bool:
    """Take down each stack's run and say what happened; True when everything asked for is gone.
    `errors`: what `down` raises for a state it cannot read (exit with its message)."""
    ok = True
    for s in stacks:
        try:
            report = down(s)
        except errors as e:
            raise fail(str(e)) from None
        if report is None:
            if not quiet_if_none:
                console.print(f"no {kind.title} for stack {s!r}: nothing to do", highlight=False)
        elif report.clean:
            console.print(
                f"{kind.title} {s} (run {report.run_id}) removed; {report.stopped} processes stopped",
                highlight=False,
            )
        else:
            ok = False
            console.print(
                f"[red]{kind.title} {s} (run {report.run_id}) NOT fully removed[/]: processes "
                f"{report.left_processes} still run"
                + "".join(f"; {x}" for x in report.left_other)
                + f"; state kept, run `down {kind.flag}` again",
                highlight=False,
            )
    return ok

