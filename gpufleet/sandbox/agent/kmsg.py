"""The node's "kmsg": `NVRM: Xid` lines, and the mark of each GPU reset, appended to a per-node
kernel-log file in kern.log format.

Format of the driver's line (gpu-faults.md): `NVRM: Xid (PCI:0000:xx:00): <code>, pid=<pid>,
name=<process>, <text>`. The driver prints pid='<unknown>' / name=<unknown> when no process context
is attached; here the process is the training rank registered for the GPU, if any. rsyslog on
Debian 12 prefixes each line with an RFC 3339 timestamp, the host name and `kernel: [uptime]`.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from gpufleet.core.host.kernel_log import reset_mark


def _stamp(at: float) -> str:
    """rsyslog's RFC 3339 timestamp of a line."""
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="microseconds")


def xid_line(
    *, host: str, at: float, uptime: float, pci: str, xid: int, pid: int | None, proc: str | None, text: str
) -> str:
    stamp = _stamp(at)
    pid_s = str(pid) if pid is not None else "'<unknown>'"
    name = proc if proc else "<unknown>"
    return (
        f"{stamp} {host} kernel: [{uptime:12.6f}] NVRM: Xid (PCI:{pci}): {xid}, "
        f"pid={pid_s}, name={name}, {text}\n"
    )


def reset_line(*, host: str, at: float, pci: str) -> str:
    """The mark `gpufleet gpu-reset` leaves after a GPU reset (core.host.kernel_log.RESET_MARK), as
    syslog files it: a userspace /dev/kmsg record, so no `kernel:` tag and no uptime."""
    return f"{_stamp(at)} {host} {reset_mark(pci)}\n"


def append_lines(path: Path, lines: list[str]) -> None:
    """Append with O_APPEND in one write, as the kernel's log writer would (no interleaving)."""
    if not lines:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(lines).encode())
    finally:
        os.close(fd)


def system_uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
