"""Process identity and liveness, one home for every layer (sandbox, chaos, game-day).

A process is identified by its PID and its start time (/proc/<pid>/stat field 22, proc(5)): PIDs get
reused after a crash (sandbox-notes.md, 10), so the start time is checked before anything is done to
a recorded PID. A zombie is dead: only its parent's wait() remains of it.

Start times are always the host time namespace's view. The kernel shifts field 22 by the READER's
boot-time offset (time_namespaces(7)), and the sandbox's node daemons and everything they start
(health checks, bundle hooks, the RebootProgram) run in time namespaces of their own
(gpufleet.sandbox.boot): a reader there converts back, so a start time recorded anywhere matches.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpufleet.core.sandbox_contract import Launch


def parse_timens_offsets(text: str) -> int:
    """The boottime offset in whole seconds of /proc/self/timens_offsets (`boottime <s> <ns>`
    lines; the sandbox's offsets have no nanoseconds: `unshare` sets seconds); 0 when the line is
    missing (the host's namespace prints zeros)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "boottime":
            return int(parts[1])
    return 0


def own_boot_offset() -> int:
    """This process's boot-time offset (0 in the host's time namespace or without time namespaces)."""
    try:
        return parse_timens_offsets(Path("/proc/self/timens_offsets").read_text())
    except OSError:
        return 0


def _host_view(pid: int) -> tuple[int, bool] | None:
    """Field 22 of /proc/<pid>/stat as the host's time namespace reads it, and whether that is exact;
    None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its closing ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    if rest[0] == "Z":
        return None
    seen = int(rest[19])  # rest[0] is field 3
    offset = own_boot_offset()
    if offset == 0:
        return seen, True
    tck = os.sysconf("SC_CLK_TCK")
    # The kernel adds this reader's offset to the start time in nanoseconds (an unsigned 64-bit sum)
    # and then divides to clock ticks (fs/proc/array.c, do_task_stat). For a process younger than
    # the reader's boot the shift is exact whole seconds. For an older one the sum wrapped around
    # 2**64 ns, which is not a whole number of ticks: the host's value is known to one tick.
    wrap = 2**64 // (1_000_000_000 // tck)
    if seen >= wrap // 2:
        return seen - wrap - offset * tck - 1, False
    return seen - offset * tck, True


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot) as the host's time namespace reads it,
    to one tick for a process older than this reader's time namespace (see `alive`); None if gone
    or a zombie."""
    seen = _host_view(pid)
    return None if seen is None else seen[0]


def alive(pid: int, started: int) -> bool:
    """The process runs and is the one recorded (not a reused PID, not a zombie). A start time read
    across a time namespace's wrap matches within one tick (10 ms at USER_HZ 100): a reused PID
    starting in the same tick as the recorded process is not a case worth telling apart."""
    seen = _host_view(pid)
    if seen is None:
        return False
    value, exact = seen
    return value == started if exact else abs(value - started) <= 1


def launch(recipe: Launch) -> tuple[subprocess.Popen[bytes], int | None]:
    """Start a daemon from its recipe in a session of its own (it outlives its starter), output
    appended to the recipe's log; returns the process and its start time (None: it died at once)."""
    log = Path(recipe.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
        popen = subprocess.Popen(
            recipe.argv(),
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=recipe.env,
            cwd=recipe.cwd,
        )
    return popen, start_time(popen.pid)


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (field 4 of /proc/<pid>/stat), living ones only."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2 :].split()
        if rest[0] != "Z" and int(rest[1]) == pid:
            out.append(int(entry.name))
    return out
