"""`gpufleet sandbox down`: remove exactly what a run made, from its state file alone.

Works on a state file left by a crashed or killed `up` (any phase), and is idempotent: removing
something already gone is not an error. Processes are stopped first (recorded ones after their
start time is verified, then whatever still runs inside the run's namespaces, then root-namespace
daemons whose command line names the run's unique directory), then mounts, links, bridges and
namespaces, then the run directory and the state file.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.procs import start_time
from gpufleet.core.sandbox_contract import SandboxState, state_path, state_root, write_state
from gpufleet.sandbox import network, processes
from gpufleet.sandbox.state import existing

# Executables a run starts in the root namespace (munged, the Prometheus forwarder in python) and
# the wrappers that exec into them.
ROOT_NS_PROGRAMS = frozenset({"munged", "python", "ip", "unshare", "sh", "dash", "bash"})


@dataclass(frozen=True)
class CleanupPlan:
    stack: str
    run_id: str
    processes: tuple[tuple[str, int, int], ...]  # (name, pid, start_time)
    namespaces: tuple[str, ...]
    bridges: tuple[str, ...]
    links: tuple[str, ...]
    mounts: tuple[str, ...]
    base_dir: str


def plan_cleanup(state: SandboxState) -> CleanupPlan:
    """What to remove, from the state file alone. Processes last-started first (slurmd before
    slurmctld before munged) so daemons stop before what they depend on; mounts innermost first."""
    procs = tuple((p.name, p.pid, p.start_time) for p in reversed(state.processes))
    namespaces = list(state.namespaces)
    for n in state.nodes:  # nodes recorded before their namespaces: cover both
        if n.netns not in namespaces:
            namespaces.append(n.netns)
    if state.head_netns and state.head_netns not in namespaces:
        namespaces.append(state.head_netns)
    return CleanupPlan(
        stack=state.stack,
        run_id=state.run_id,
        processes=procs,
        namespaces=tuple(namespaces),
        bridges=tuple(state.bridges),
        links=tuple(state.links),
        mounts=tuple(sorted(state.mounts, key=len, reverse=True)),
        base_dir=state.base_dir,
    )


@dataclass
class DownReport:
    stack: str
    run_id: str
    stopped: int = 0
    left_processes: list[int] = field(default_factory=list)
    network_errors: list[str] = field(default_factory=list)
    unmount_errors: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.left_processes or self.network_errors or self.unmount_errors)


def _mounted() -> set[str]:
    try:
        return {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()}
    except OSError:
        return set()


def _stop_namespace_processes(namespaces: tuple[str, ...], grace_s: float) -> tuple[int, list[int]]:
    pids: dict[int, int] = {}
    for ns in namespaces:
        for pid in network.netns_pids(ns):
            st = start_time(pid)
            if st is not None:
                pids[pid] = st
    return len(pids), processes.stop_pids(pids, grace_s)


def execute(plan: CleanupPlan, grace_s: float = 5.0) -> DownReport:
    report = DownReport(plan.stack, plan.run_id)
    recorded = {pid: st for _, pid, st in plan.processes}
    report.stopped += len([p for p, st in recorded.items() if start_time(p) == st])
    left = processes.stop_pids(recorded, grace_s)
    have_ns = network.existing_netns()
    live_ns = tuple(ns for ns in plan.namespaces if ns in have_ns)
    # Twice: a dying slurmd may have forked a step (slurmstepd) between listing and signalling.
    for _ in range(2):
        n, left_ns = _stop_namespace_processes(live_ns, grace_s)
        report.stopped += n
    strays = processes.pids_mentioning(plan.base_dir, ROOT_NS_PROGRAMS) if plan.base_dir else {}
    report.stopped += len(strays)
    left_strays = processes.stop_pids(strays, grace_s)
    report.left_processes = sorted(set(left) | set(left_ns) | set(left_strays))

    mounted = _mounted()
    for m in plan.mounts:
        if m in mounted:
            res = subprocess.run(["umount", "-l", m], capture_output=True, text=True, timeout=30)
            if res.returncode != 0:
                report.unmount_errors.append(f"{m}: {res.stderr.strip()}")
    report.network_errors = network.remove(plan.namespaces, plan.bridges, plan.links)
    return report


def down(
    stack: str, root: Path | None = None, keep_files: bool = False, grace_s: float = 5.0
) -> DownReport | None:
    """Remove a stack's sandbox. None if there is none."""
    found = existing(stack, root)
    if found.state is None:
        if found.error is not None:
            raise RuntimeError(f"unreadable state file {found.error}; remove the run by hand")
        return None
    state = found.state
    if state.phase != "deleting":
        state = state.model_copy(update={"phase": "deleting"})
        write_state(state, root)
    report = execute(plan_cleanup(state), grace_s)
    if not report.clean:
        return report  # keep the state file: a second `down` retries what is left
    base = Path(state.base_dir)
    if not keep_files and base.is_dir() and base.name == f"run-{state.run_id}":
        shutil.rmtree(base, ignore_errors=True)
    path = state_path(stack, root)
    path.unlink(missing_ok=True)
    if not keep_files:
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only if empty
    return report


def all_stacks(root: Path | None = None) -> list[str]:
    r = root or state_root()
    if not r.is_dir():
        return []
    return sorted(p.parent.name for p in r.glob("*/state.json"))
