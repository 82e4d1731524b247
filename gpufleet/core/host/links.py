"""Fabric port state in sysfs: Ethernet/RoCE interfaces under /sys/class/net and HCA ports under
/sys/class/infiniband, as THIS process sees them (under `ip netns exec`, the namespace's)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SYS_CLASS_NET = Path("/sys/class/net")
SYS_CLASS_IB = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class LinkReading:
    name: str  # interface (fab0) or HCA port (mlx5_0/1)
    up: bool
    state: str  # operstate, or the HCA port's state line (`4: ACTIVE`); "absent" when missing
    speed_gbps: float | None = None  # negotiated rate; None: not reported (down, or a virtual link)
    # Lost-carrier events since boot, counted as carrier changes (two per down/up cycle); None: not
    # readable.
    carrier_changes: int | None = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # EINVAL: `speed` of a link that is down
        return None


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def read_net_links(ifnames: Sequence[str], root: Path = SYS_CLASS_NET) -> list[LinkReading]:
    """operstate, speed (Mb/s; -1 when unknown) and carrier_changes of each named interface; a
    missing interface is an absent port."""
    out = []
    for n in ifnames:
        state = _read(root / n / "operstate")
        if state is None:
            out.append(LinkReading(n, False, "absent"))
            continue
        mbps = _int(_read(root / n / "speed"))
        out.append(LinkReading(n, state == "up", state,
                               speed_gbps=mbps / 1000 if mbps is not None and mbps > 0 else None,
                               carrier_changes=_int(_read(root / n / "carrier_changes"))))
    return out


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def ib_port(port: Path) -> LinkReading | None:
    """One HCA port directory (<hca>/ports/<n>): `state` reads `4: ACTIVE` when up, `rate` reads
    `400 Gb/sec (4X NDR)`; `counters/link_downed` counts the times the link went down (kernel
    Documentation/ABI/stable/sysfs-class-infiniband; one per flap, so doubled into carrier
    changes). None when the port has no state file."""
    state = _read(port / "state")
    if state is None:
        return None
    m = _RATE.match(_read(port / "rate") or "")
    downed = _int(_read(port / "counters" / "link_downed"))
    return LinkReading(f"{port.parent.parent.name}/{port.name}", state.startswith("4"), state,
                       speed_gbps=float(m[1]) if m else None,
                       carrier_changes=None if downed is None else 2 * downed)


def read_ib_ports(root: Path = SYS_CLASS_IB, hcas: Sequence[str] | None = None) -> list[LinkReading]:
    """Every HCA port under `root`, or, with `hcas`, port 1 of each named HCA (absent if missing)."""
    if hcas is not None:
        return [ib_port(root / h / "ports" / "1") or LinkReading(f"{h}/1", False, "absent") for h in hcas]
    return [r for p in sorted(root.glob("*/ports/*")) if (r := ib_port(p)) is not None]
