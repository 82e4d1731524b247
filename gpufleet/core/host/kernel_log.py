"""NVIDIA XID lines of the kernel log: the pure parser and the two ways a host reads them (a log
file such as kern.log, or the ring buffer through `dmesg`), and the line that records a GPU reset.

A GPU reset leaves no line of its own: neither the driver's log nor a DCGM field reports one (NVIDIA
NVSentinel's design 020, "NVSentinel Support for GPU Reset", says so, and has its reset job write a
log line instead). So whoever resets a GPU through gpufleet (`gpufleet gpu-reset`, the sandbox agent's
/clear) writes RESET_MARK after a successful reset, and the reader dates each GPU's last reset from
it: XIDs before it are history (escalation still counts them), not the GPU's present state. A
boot line (`Linux version ...`, the kernel's first) resets every GPU, for a log file that spans
reboots (kern.log; the ring buffer read by `dmesg` starts at the boot anyway). ADR 0079."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.host import HostReadError, run_tool

KERNEL_LOG_TAIL = 4 * 1024 * 1024  # bytes of kern.log read (bounded time and memory)


@dataclass(frozen=True)
class XidSeen:
    gpu: int | None  # None when the PCI address maps to no known GPU
    xid: int
    at: float
    pci: str | None = None


@dataclass(frozen=True)
class KernelLog:
    """What a kernel log says about the GPUs: every XID in it, and when each GPU was last reset."""

    xids: tuple[XidSeen, ...]  # in log order
    current: tuple[XidSeen, ...]  # the XIDs after their GPU's last reset (or the last boot), log order
    resets: dict[str, float]  # PCI address -> time of the last reset mark for it (after the last boot)
    boot_at: float | None = None  # the last boot line in the log

    def reset_at(self, pci: str | None) -> float | None:
        """When the GPU at `pci` was last reset or booted, per this log; None: not in it."""
        at = self.resets.get(pci) if pci is not None else None
        return at if at is not None else self.boot_at


RESET_MARK = "gpufleet: GPU reset done (PCI:{pci})"
_PCI = r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?"
_XID = re.compile(r"NVRM: Xid \(PCI:" + _PCI + r"\): (\d+),")
_RESET = re.compile(r"gpufleet: GPU reset done \(PCI:" + _PCI + r"\)")
# The kernel's first line at boot; in kern.log `... kernel: [    0.000000] Linux version 6.1.0-...`,
# in `dmesg --time-format iso` `<stamp> Linux version 6.1.0-...`.
_BOOT = re.compile(r"(?:\[\s*0\.0+\]|^\S+) Linux version \d+\.\d+")
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def normalize_pci(text: str) -> str:
    """`00000000:18:00.0`, `0000:18:00` -> `0000:18:00` (the form in `NVRM: Xid (PCI:...)` lines)."""
    parts = text.strip().lower().split(":")
    if len(parts) < 3:
        raise ValueError(f"not a PCI address: {text!r}")
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"


def parse_kernel_log(lines: Iterable[str], pci_to_gpu: dict[str, int], default_at: float) -> KernelLog:
    """`NVRM: Xid` lines, reset marks and boot lines of kern.log / `dmesg --time-format iso` output.

    A line without an RFC 3339 timestamp (plain dmesg) is dated `default_at` (now)."""
    xids: list[XidSeen] = []
    current: list[XidSeen] = []
    resets: dict[str, float] = {}
    boot_at: float | None = None
    for line in lines:
        m, r = _XID.search(line), _RESET.search(line)
        if not (m or r or _BOOT.search(line)):
            continue
        at = default_at
        ts = _STAMP.match(line)
        if ts:
            with contextlib.suppress(ValueError):
                at = dt.datetime.fromisoformat(ts[1].replace(",", ".")).timestamp()
        if m:
            pci = normalize_pci(m[1])
            seen = XidSeen(pci_to_gpu.get(pci), int(m[2]), at, pci)
            xids.append(seen)
            current.append(seen)
        elif r:
            pci = normalize_pci(r[1])
            resets[pci] = at
            current = [x for x in current if x.pci != pci]
        else:
            boot_at, resets, current = at, {}, []
    return KernelLog(tuple(xids), tuple(current), resets, boot_at)


def reset_mark(pci: str) -> str:
    """The line `gpufleet gpu-reset` writes after resetting the GPU at `pci` (normalized here)."""
    return RESET_MARK.format(pci=normalize_pci(pci))


def read_kernel_log(path: Path, pci_to_gpu: dict[str, int], now: float) -> KernelLog:
    """The last KERNEL_LOG_TAIL bytes of a log file."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - KERNEL_LOG_TAIL))
            data = fh.read().decode("utf-8", "replace")
    except OSError as e:
        raise HostReadError(f"kernel log {path}: {e.strerror}") from None
    return parse_kernel_log(data.splitlines(), pci_to_gpu, now)


def read_dmesg(pci_to_gpu: dict[str, int], now: float) -> KernelLog:
    """The kernel ring buffer since boot (so a reboot clears old XIDs, as on a real node)."""
    # slurmd may start its HealthCheckProgram with a PATH that lacks /usr/bin.
    exe = "dmesg" if shutil.which("dmesg") else "/usr/bin/dmesg"
    text = run_tool([exe, "--time-format", "iso"])
    return parse_kernel_log(text.splitlines(), pci_to_gpu, now)


KMSG = Path("/dev/kmsg")
# Priority prefix of a /dev/kmsg record: 5 = notice. Userspace records get the user facility; the
# kernel refuses the kernel facility to them (Documentation/ABI/testing/dev-kmsg), so `dmesg` shows
# the mark and a syslog file takes it only where it keeps user-facility messages (Debian's syslog).
_KMSG_PRIORITY = "<5>"


def write_reset_mark(pci: str, kmsg: Path = KMSG) -> str:
    """Record a GPU reset in the kernel log, one record in one write (/dev/kmsg takes a record per
    write). Returns the line written; OSError when `kmsg` cannot be written."""
    line = reset_mark(pci)
    fd = os.open(kmsg, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{_KMSG_PRIORITY}{line}\n".encode())
    finally:
        os.close(fd)
    return line
