"""What the node-health checker observed (plain data) and the pure parsers that produce it from
`dcgmi dmon` and `nvidia-smi` output. The kernel log's XIDs, nvidia-smi's CSV and the sysfs port
readers are the host's, shared with fleet inspection (gpufleet.core.host)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.core.host import SmiGpu
from gpufleet.core.host.kernel_log import XidSeen, normalize_pci, parse_kernel_log
from gpufleet.core.host.links import LinkReading
from gpufleet.core.host.nvidia_smi import parse_query_gpu

__all__ = ["GpuReading", "LinkReading", "Observations", "XidSeen", "gpu_readings", "merge_xids",
           "normalize_pci", "parse_dcgmi_dmon", "parse_kernel_log", "parse_nvidia_smi"]


@dataclass(frozen=True)
class GpuReading:
    index: int
    fields: dict[int, float] = field(default_factory=dict)  # DCGM field id -> value
    metrics: dict[str, float] = field(default_factory=dict)  # AMD / Ascend exporter series -> value
    reset_at: float | None = None  # last GPU reset / node reboot: older XIDs are history only


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


def gpu_readings(gpus: Sequence[SmiGpu]) -> tuple[list[GpuReading], dict[str, int]]:
    """nvidia-smi's records as DCGM-keyed readings (311 ECC_DBE_VOL_TOTAL, 310 ECC_SBE_VOL_TOTAL,
    150 GPU_TEMP; a value nvidia-smi could not give is left out) and the PCI -> index map."""
    out = []
    for g in gpus:
        values = {fid: v for fid, v in ((311, g.ecc_uncorrected_volatile), (310, g.ecc_corrected_volatile),
                                        (150, g.temperature_c)) if v is not None}
        out.append(GpuReading(g.index, values))
    return out, {g.pci: g.index for g in gpus}


def parse_nvidia_smi(text: str) -> tuple[list[GpuReading], dict[str, int]]:
    """`nvidia-smi --query-gpu=<core.host.nvidia_smi.GPU_QUERY> --format=csv,noheader,nounits`."""
    return gpu_readings(parse_query_gpu(text))
