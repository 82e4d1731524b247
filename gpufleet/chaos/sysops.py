"""Thin I/O helpers over processes, namespaces and commands (every call bounded in time)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from chaoslib.exceptions import ActivityFailed

from gpufleet.core.procs import start_time

COMMAND_TIMEOUT_S = 20.0


def run(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
    """Run a command; stdout on success. Failure -> ActivityFailed naming the command and stderr."""
    try:
        cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ActivityFailed(f"command not found: {argv[0]} (install it; see docs/chaos.md)") from None
    except subprocess.TimeoutExpired:
        raise ActivityFailed(f"command timed out after {timeout:g} s: {' '.join(argv)}") from None
    if check and cp.returncode != 0:
        raise ActivityFailed(f"`{' '.join(argv)}` failed ({cp.returncode}): {cp.stderr.strip()[:500]}")
    return cp.stdout


def netns_pids(netns: str) -> list[int]:
    """PIDs whose network namespace is `netns` (`ip netns pids`)."""
    out = run(["ip", "netns", "pids", netns], check=False)
    return sorted(int(x) for x in out.split() if x.isdigit() and int(x) != os.getpid())


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.decode(errors="replace").partition("=")
        if sep:
            out[k] = v
    return out


def signal_verified(pid: int, st: int | None, sig: int) -> bool:
    """Send sig only if pid still has start time st (None: no check)."""
    if st is not None and start_time(pid) != st:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def snapshot(pids: Sequence[int]) -> list[tuple[int, int]]:
    out = []
    for pid in pids:
        st = start_time(pid)
        if st is not None:
            out.append((pid, st))
    return out


def kill_all(procs: Sequence[tuple[int, int]]) -> int:
    """SIGCONT (a frozen process cannot die cleanly) then SIGKILL; returns how many were signalled."""
    n = 0
    for pid, st in procs:
        signal_verified(pid, st, signal.SIGCONT)
        n += signal_verified(pid, st, signal.SIGKILL)
    return n
