"""NVIDIA XID lines of the kernel log: the pure parser and the two ways a host reads them (a log
file such as kern.log, or the ring buffer through `dmesg`)."""

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


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): (\d+),")
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def normalize_pci(text: str) -> str:
    """`00000000:18:00.0`, `0000:18:00` -> `0000:18:00` (the form in `NVRM: Xid (PCI:...)` lines)."""
    parts = text.strip().lower().split(":")
    if len(parts) < 3:
        raise ValueError(f"not a PCI address: {text!r}")
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"


def parse_kernel_log(lines: Iterable[str], pci_to_gpu: dict[str, int], default_at: float) -> list[XidSeen]:
    """`NVRM: Xid` lines of kern.log / `dmesg --time-format iso` output.

    A line without an RFC 3339 timestamp (plain dmesg) is dated `default_at` (now)."""
    out = []
    for line in lines:
        m = _XID.search(line)
        if not m:
            continue
        pci = normalize_pci(m[1])
        at = default_at
        ts = _STAMP.match(line)
        if ts:
            with contextlib.suppress(ValueError):
                at = dt.datetime.fromisoformat(ts[1].replace(",", ".")).timestamp()
        out.append(XidSeen(pci_to_gpu.get(pci), int(m[2]), at, pci))
    return out


def read_kernel_log(path: Path, pci_to_gpu: dict[str, int], now: float) -> list[XidSeen]:
    """The XIDs in the last KERNEL_LOG_TAIL bytes of a log file."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - KERNEL_LOG_TAIL))
            data = fh.read().decode("utf-8", "replace")
    except OSError as e:
        raise HostReadError(f"kernel log {path}: {e.strerror}") from None
    return parse_kernel_log(data.splitlines(), pci_to_gpu, now)


def read_dmesg(pci_to_gpu: dict[str, int], now: float) -> list[XidSeen]:
    """The kernel ring buffer since boot (so a reboot clears old XIDs, as on a real node)."""
    # slurmd may start its HealthCheckProgram with a PATH that lacks /usr/bin.
    exe = "dmesg" if shutil.which("dmesg") else "/usr/bin/dmesg"
    text = run_tool([exe, "--time-format", "iso"])
    return parse_kernel_log(text.splitlines(), pci_to_gpu, now)
