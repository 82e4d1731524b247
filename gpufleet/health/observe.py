"""What the node-health checker observed (plain data) and the pure parsers that produce it from
the kernel log, `dcgmi dmon` and `nvidia-smi` output."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class XidSeen:
    gpu: int | None  # None when the PCI address maps to no known GPU
    xid: int
    at: float
    pci: str | None = None


@dataclass(frozen=True)
class GpuReading:
    index: int
    fields: dict[int, float] = field(default_factory=dict)  # DCGM field id -> value
    metrics: dict[str, float] = field(default_factory=dict)  # AMD / Ascend exporter series -> value
    reset_at: float | None = None  # last GPU reset / node reboot: older XIDs are history only


@dataclass(frozen=True)
class LinkReading:
    name: str  # interface (fab0) or HCA port (mlx5_0/1)
    up: bool
    state: str


@dataclass(frozen=True)
class Observations:
    node: str
    now: float
    gpus: tuple[GpuReading, ...] | None  # None: no GPU source could be read
    xids: tuple[XidSeen, ...] = ()  # every XID in the available history (escalation needs it)
    links: tuple[LinkReading, ...] | None = ()  # None: link state could not be read
    mount_seconds: float | None = None  # stat latency of the checkpoint mount (None: not checked)
    mount_path: str | None = None
    unknown: tuple[str, ...] = ()  # why a source could not be checked
    # Host signals (catalog HOST_SIGNALS: BMC sensors, EDAC, local disk, port error counters);
    # None: not read on this node.
    host: dict[str, float] | None = None


# --------------------------------------------------------------------------- kernel log

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


def merge_xids(a: Sequence[XidSeen], b: Sequence[XidSeen]) -> list[XidSeen]:
    """Union of two views of the same events (agent/DCGM and kernel log): an event seen by both
    counts once; identical events of a burst keep the larger multiplicity."""

    def key(x: XidSeen) -> tuple[int | None, int, float]:
        return (x.gpu, x.xid, round(x.at, 3))

    ca, cb = Counter(key(x) for x in a), Counter(key(x) for x in b)
    by_key = {key(x): x for x in [*b, *a]}
    out = []
    for k in set(ca) | set(cb):
        out += [by_key[k]] * max(ca[k], cb[k])
    return sorted(out, key=lambda x: (x.at, x.gpu if x.gpu is not None else -1, x.xid))


# --------------------------------------------------------------------------- DCGM / NVML


def parse_dcgmi_dmon(text: str, field_ids: Sequence[int]) -> list[GpuReading]:
    """`dcgmi dmon -e <ids> -c 1`: lines `GPU <i> <v1> <v2> ...` in the order of -e; N/A skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != "GPU" or not parts[1].isdigit():
            continue
        values: dict[int, float] = {}
        for fid, raw in zip(field_ids, parts[2:], strict=False):
            try:
                values[fid] = float(raw)
            except ValueError:
                continue  # N/A
        out.append(GpuReading(int(parts[1]), values))
    return out


# nvidia-smi --query-gpu fields and the DCGM field each stands for.
NVSMI_QUERY = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total",
               "ecc.errors.corrected.volatile.total", "temperature.gpu")
NVSMI_FIELDS = {2: 311, 3: 310, 4: 150}


def parse_nvidia_smi(text: str) -> tuple[list[GpuReading], dict[str, int]]:
    """`nvidia-smi --query-gpu=<NVSMI_QUERY> --format=csv,noheader,nounits` -> readings, PCI map."""
    gpus, pci = [], {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < len(NVSMI_QUERY) or not cols[0].isdigit():
            continue
        idx = int(cols[0])
        values: dict[int, float] = {}
        for col, fid in NVSMI_FIELDS.items():
            try:
                values[fid] = float(cols[col])
            except ValueError:
                continue  # [N/A], [Not Supported]
        gpus.append(GpuReading(idx, values))
        pci[normalize_pci(cols[1])] = idx
    return gpus, pci
