"""Starting the sandbox's daemons and stopping them safely after a crash.

Every process is recorded with its PID and start time (/proc/<pid>/stat field 22, proc(5)); before
signalling, the start time is checked again because PIDs get reused (sandbox-notes.md, 10).
Stopping is SIGCONT (a frozen process cannot act on SIGTERM), SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core import procs
from gpufleet.core.procs import start_time
from gpufleet.core.sandbox_contract import Launch, SandboxProcess


def alive(p: SandboxProcess) -> bool:
    return procs.alive(p.pid, p.start_time)


# What a daemon started without an explicit environment gets: enough to find its programs and the
# venv's Python packages, nothing of the caller's session (the state file records it verbatim).
_INHERITED_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "HOME", "VIRTUAL_ENV", "TZ")


def base_env() -> dict[str, str]:
    return {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}


@dataclass
class Timings:
    """Seconds from the start of a bring-up to each named step (`sandbox up`, Slurm or Kubernetes)."""

    marks: dict[str, float] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def mark(self, name: str) -> None:
        self.marks[name] = round(time.monotonic() - self.t0, 3)


@dataclass
class Started:
    record: SandboxProcess
    popen: subprocess.Popen[bytes]


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    netns: str | None = None,
    hostname: str | None = None,
    env: dict[str, str] | None = None,
    node: str | None = None,
) -> Started:
    """Start a daemon in its own session (it outlives `up`), output appended to `log`.

    The record carries the launch recipe, so a chaos rollback can start the same daemon again after
    killing it (SandboxProcess contract)."""
    recipe = Launch(
        program=list(argv),
        netns=netns,
        hostname=hostname,
        env=dict(env) if env is not None else base_env(),
        log=str(log),
    )
    popen, st = procs.launch(recipe)
    if st is None:
        popen.wait(timeout=5)
        raise RuntimeError(f"{name} exited at once with code {popen.returncode}; see {log}")
    record = SandboxProcess(
        name=name,
        pid=popen.pid,
        start_time=st,
        netns=netns,
        launch=recipe,
        node=node if node is not None else hostname,
    )
    return Started(record, popen)


def signal_verified(p: SandboxProcess, sig: int) -> bool:
    """Send sig only if the PID still names the process we started."""
    if not alive(p):
        return False
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_pids(pids: dict[int, int], grace_s: float = 5.0) -> list[int]:
    """Stop processes given as {pid: start_time}; returns those still alive at the end."""
    live = {pid: st for pid, st in pids.items() if start_time(pid) == st}
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for pid in live:
            _signal_pid(pid, sig)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = {pid: st for pid, st in live.items() if start_time(pid) == st}
        if live:
            time.sleep(0.05)
    for pid, st in live.items():
        if start_time(pid) == st:
            _signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while live and time.monotonic() < deadline:
        live = {pid: st for pid, st in live.items() if start_time(pid) == st}
        if live:
            time.sleep(0.05)
    return sorted(live)


def stop(procs: Iterable[SandboxProcess], grace_s: float = 5.0) -> list[int]:
    return stop_pids({p.pid: p.start_time for p in procs}, grace_s)


def pids_mentioning(text: str, programs: frozenset[str]) -> dict[int, int]:
    """{pid: start_time} of every process running one of `programs` (executable base names) whose
    command line contains `text` (a run's unique base directory): catches a daemon that `up`
    started but had no time to record before a crash, and nothing else (not a `tail -f` of a log)."""
    me = os.getpid()
    out: dict[int, int] = {}
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            try:
                exe = os.path.basename(os.readlink(entry / "exe"))
            except OSError:
                continue
            if not any(exe == p or exe.startswith(p) for p in programs):
                continue
            st = start_time(int(entry.name))
            if st is not None:
                out[int(entry.name)] = st
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size from /proc/<pid>/status (VmRSS, kB); 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
