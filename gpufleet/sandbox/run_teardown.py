"""Taking down a run that a sandbox recorded in its state file (the Kubernetes and the storage
sandboxes): stop the processes it lists in a given order, then any stray that names the run's
folder, and remove the folder and the state file only when nothing is left running.

One teardown for every kind of sandbox that records its run this way, so that the order of what is
kept on failure (the state file, for a second `down` to retry) is the same everywhere.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpufleet.core.sandbox_contract import SandboxProcess
from gpufleet.sandbox import processes


class RecordedRun(Protocol):
    """What a state file records about a run (KubeSandboxState, StorageSandboxState)."""

    @property
    def stack(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def base_dir(self) -> str: ...
    @property
    def processes(self) -> Sequence[SandboxProcess]: ...


@dataclass
class RunDownReport:
    stack: str
    run_id: str
    stopped: int = 0
    left_processes: list[int] = field(default_factory=list)
    left_other: list[str] = field(default_factory=list)  # what `after_stop` could not remove

    @property
    def clean(self) -> bool:
        return not (self.left_processes or self.left_other)


def _tier_of(name: str, order: Sequence[str | None]) -> int:
    """The position in `order` of the first prefix `name` starts with, else that of None (every
    other process)."""
    for i, prefix in enumerate(order):
        if prefix is not None and name.startswith(prefix):
            return i
    return order.index(None)


def stop_in_order(
    recorded: Iterable[SandboxProcess],
    order: Sequence[str | None],
    base_dir: str,
    programs: frozenset[str],
    grace_s: float,
) -> tuple[int, list[int]]:
    """Stop the recorded processes tier by tier (`order`: name prefixes, None standing for every
    process no prefix names; a daemon goes after the ones that talk to it), then the strays: a
    process of `programs` whose command line names `base_dir` that the run had not yet recorded.
    Returns (processes stopped, pids still alive)."""
    if None not in order:
        raise ValueError("the stop order must place the unnamed processes (None)")
    recorded = list(recorded)
    live = {p.pid: p.start_time for p in recorded if processes.alive(p)}
    left: list[int] = []
    for tier in range(len(order)):
        pids = {p.pid: p.start_time for p in recorded if p.pid in live and _tier_of(p.name, order) == tier}
        left += processes.stop_pids(pids, grace_s)
    strays = {pid: st for pid, st in processes.pids_mentioning(base_dir, programs).items() if pid not in live}
    left += processes.stop_pids(strays, grace_s)
    return len(live) + len(strays), sorted(set(left))


def remove_run(
    state: RecordedRun,
    state_path: Path,
    mark_deleting: Callable[[], object],
    order: Sequence[str | None],
    programs: frozenset[str],
    grace_s: float,
    keep_files: bool = False,
    after_stop: Callable[[], list[str]] | None = None,
) -> RunDownReport:
    """Mark the run "deleting" (a crash from here on leaves a state `down` retries), stop its
    processes, then what `after_stop` removes (it returns what it could not), and, when nothing is
    left, remove its folder (only the run's own, `run-<id>` beside the
    state file), the state file and the then empty parent folders (the sandbox kind's, the
    stack's)."""
    if state.phase != "deleting":
        mark_deleting()
    stopped, left = stop_in_order(reversed(state.processes), order, state.base_dir, programs, grace_s)
    report = RunDownReport(state.stack, state.run_id, stopped, left)
    if after_stop is not None and not left:
        report.left_other = after_stop()
    if not report.clean:
        return report  # keep the state file: a second `down` retries
    base = Path(state.base_dir)
    own_folder = base.name == f"run-{state.run_id}" and base.parent == state_path.parent
    if not keep_files and own_folder and base.is_dir():
        shutil.rmtree(base, ignore_errors=True)
    state_path.unlink(missing_ok=True)
    if not keep_files:
        for d in (state_path.parent, state_path.parent.parent):
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty
    return report
