"""A PCI device's link as the Linux PCI core reports it in sysfs: the lanes and speed it trained to
(`current_link_width`, `current_link_speed`, from the Link Status register) and what the device can
do (`max_link_width`, `max_link_speed`, from Link Capabilities); Documentation/ABI/testing/
sysfs-bus-pci. Vendor-neutral: it gives the link of an NPU whose SMI tool prints none (npu-smi), and
the capability a link is judged against when no datasheet figure is pinned for the SKU."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SYS_BUS_PCI = Path("/sys/bus/pci/devices")

# PCIe generation by per-lane rate in GT/s (PCI-SIG base specifications 1.0-6.0: 2.5, 5, 8, 16, 32,
# 64 GT/s). The kernel prints e.g. "16.0 GT/s PCIe" (newer) or "8 GT/s" / "2.5 GT/s" (older).
_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


@dataclass(frozen=True)
class PciLink:
    width: int | None  # lanes the link trained to
    max_width: int | None  # lanes the device supports
    max_gen: int | None  # generation the device supports (its current speed drops when idle)


def gen_of(speed: str) -> int | None:
    """`16.0 GT/s PCIe` -> 4; None for "Unknown" or a rate no generation has."""
    m = _RATE.match(speed)
    return _GEN_BY_RATE.get(float(m[1])) if m else None


def width_of(text: str) -> int | None:
    """`16` -> 16; None for 0 (no link) or anything not a lane count."""
    t = text.strip()
    return int(t) if t.isdigit() and int(t) > 0 else None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def read_pci_link(pci: str, root: Path = SYS_BUS_PCI) -> PciLink | None:
    """The link of the device at `pci` (normalized domain:bus:dev; function 0); None when sysfs has no
    such device or it reports no link (a device that is not PCI Express has no link attributes)."""
    dev = root / f"{pci}.0"
    if not dev.is_dir():
        return None
    link = PciLink(width_of(_read(dev / "current_link_width")), width_of(_read(dev / "max_link_width")),
                   gen_of(_read(dev / "max_link_speed")))
    return None if link == PciLink(None, None, None) else link
