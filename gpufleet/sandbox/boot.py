"""A sandbox node's boot, as Slurm sees it: its daemons run in a Linux time namespace of their own
whose boot-time clock starts at the node's "boot" (ADR 0064).

slurmd reports its node's boot time as now minus the uptime (sysinfo(2)), and slurmctld considers a
`scontrol reboot` done only when the node registers with a boot time no older than the request
(scontrol(1), Slurm 22.05). In a network namespace every slurmd would read the host's uptime, so
no sandbox node could ever look rebooted. A time namespace (time_namespaces(7), Linux >= 5.6) shifts
CLOCK_BOOTTIME, /proc/uptime and sysinfo(2) for the processes in it: `unshare --time --boottime -N`
gives them an uptime N seconds shorter than the host's.

The offset is written into the daemon's Launch recipe, so the recipe records when the node booted:
restarting a daemon from its recipe (a chaos crash, the daemon-restart upgrade driver) keeps the
node's boot time, and only a reboot (gpufleet.sandbox.node_reboot) writes a new offset.

Two kernel facts shape the functions below, both checked on this machine (kernel 6.18):
- the offsets of a nested namespace are absolute (relative to the host's clock), not relative to
  the namespace it is created from;
- /proc/<pid>/stat's start time (field 22) is shifted by the READER's boot-time offset, so a
  process inside a node's namespace must convert it before comparing with the state file's values
  (which are the host's view); and a process that started before the reader's namespace booted
  reads as a wrapped-around number. So all the daemons of a node share one offset, taken before
  the first of them starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gpufleet.core.procs import own_boot_offset

WRAPPER = ("unshare", "--time", "--boottime")
# The uptime a freshly "booted" node starts with. The node's boot time must not precede Slurm's
# reboot request, or slurmctld keeps waiting (it needs boot time >= the request time; see
# reboot_offset_not_before). Whole seconds are all `unshare` takes, so the uptime starts between 0
# and 1 s.
FRESH_UPTIME_S = 0


def booted(program: Sequence[str], offset_s: int) -> list[str]:
    """`program` run in a new time namespace whose boot-time clock is `offset_s` (<= 0) seconds off
    the host's; an earlier wrapper (a previous boot) is replaced."""
    if offset_s > 0:
        raise ValueError(f"a boot-time offset is never positive (no boot in the future): {offset_s}")
    return [*WRAPPER, str(offset_s), "--", *unwrapped(program)]


def unwrapped(program: Sequence[str]) -> list[str]:
    """The daemon's own argv, without a time-namespace wrapper."""
    out = list(program)
    n = len(WRAPPER)
    if tuple(out[:n]) == WRAPPER and len(out) > n + 1 and out[n + 1] == "--":
        return out[n + 2:]
    return out


def boot_offset_of(program: Sequence[str]) -> int | None:
    """The recipe's boot-time offset, None when it runs in the host's time namespace."""
    n = len(WRAPPER)
    if tuple(program[:n]) == WRAPPER and len(program) > n + 1 and program[n + 1] == "--":
        return int(program[n])
    return None


def fresh_offset(ns_uptime_s: float, ns_offset_s: int, uptime_s: int = FRESH_UPTIME_S) -> int:
    """The offset that makes a new namespace's uptime `uptime_s` (plus the fraction of the current
    second), computed from inside a namespace whose uptime is `ns_uptime_s` and offset `ns_offset_s`
    (offsets are absolute: the host's uptime is the namespace's minus its offset)."""
    host_uptime = ns_uptime_s - ns_offset_s
    return -(math.floor(host_uptime) - uptime_s)


def slurm_boot_time(now_s: float, ns_uptime_s: float) -> int:
    """The boot time slurmctld computes from a node's registration: its own clock in whole seconds
    (time(2)) minus the uptime slurmd read with sysinfo(2), which the kernel rounds UP to whole
    seconds (kernel/sys.c, do_sysinfo; checked on this machine). So it can be up to 2 s older than
    the true boot."""
    return math.floor(now_s) - math.ceil(ns_uptime_s)


def reboot_offset_not_before(started_s: float) -> float:
    """The wall time from which a RebootProgram started at `started_s` may take its new boot's
    offset. slurmctld's reboot request (whole seconds, time(2)) precedes the program, and completes
    only when slurm_boot_time() is no older than it. slurm_boot_time() is less than 2 s older than
    the boot, so a boot later than the request's whole second + 1 always completes; a boot taken at
    t is later than t - 1 s (FRESH_UPTIME_S), so t is the request's whole second + 2. One second
    from the program's start was not enough and stalled a CI run's reboots: slurmctld never logged
    "returned to service"."""
    return math.floor(started_s) + 2


def boot_time(now_s: float, host_uptime_s: float, offset_s: int) -> float:
    """When a node whose daemons run with `offset_s` booted (Unix seconds): what slurmd reports."""
    return now_s - (host_uptime_s + offset_s)


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def new_boot_offset() -> int:
    """The offset for a node booting now, wherever this runs."""
    return fresh_offset(uptime(), own_boot_offset())


# One boot per node per process: the daemons of a node that one `sandbox up` starts share its boot.
_NODE_OFFSETS: dict[str, int] = {}


def node_boot_offset(netns: str) -> int:
    """The boot-time offset of the node whose namespace is `netns`, the first time it is asked for in
    this process. Every daemon of a node must share it: a process in the node's time namespace reads
    the start time of a process that started before that namespace's boot as a wrapped-around
    value, so the node's RebootProgram could not recognise (and stop) a daemon started earlier than
    slurmd, its parent."""
    if netns not in _NODE_OFFSETS:
        _NODE_OFFSETS[netns] = new_boot_offset()
    return _NODE_OFFSETS[netns]
