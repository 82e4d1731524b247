"""Process identity and liveness, one home for every layer (sandbox, chaos, game-day).

A process is identified by its PID and its start time (/proc/<pid>/stat field 22, proc(5)): PIDs get
reused after a crash (sandbox-notes.md, 10), so the start time is checked before anything is done to
a recorded PID. A zombie is dead: only its parent's wait() remains of it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpufleet.core.sandbox_contract import Launch


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot); None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its closing ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    if rest[0] == "Z":
        return None
    return int(rest[19])  # rest[0] is field 3


def alive(pid: int, started: int) -> bool:
    """The process runs and is the one recorded (not a reused PID, not a zombie)."""
    return start_time(pid) == started


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
