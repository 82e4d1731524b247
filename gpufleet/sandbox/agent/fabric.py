"""Fabric link state read from the kernel, as node_exporter's netclass/netdev collectors read it.

/sys/class/net shows the interfaces of the network namespace that MOUNTED /sys, not of the reading
process: start the agent with `ip netns exec <ns>` (which remounts /sys for the namespace), or the
agent reads the root namespace's links. A configured interface that does not exist is reported
down (a missing port is a down port), never silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SYS_CLASS_NET = Path("/sys/class/net")

# statistics/<file> -> node_exporter metric (netdev collector, counters).
STAT_METRICS = {
    "rx_bytes": "node_network_receive_bytes_total",
    "tx_bytes": "node_network_transmit_bytes_total",
    "rx_errors": "node_network_receive_errs_total",
    "tx_errors": "node_network_transmit_errs_total",
    "rx_dropped": "node_network_receive_drop_total",
    "tx_dropped": "node_network_transmit_drop_total",
}

# InfiniBand port state (ib_verbs / node_exporter infiniband collector): 1 DOWN, 4 ACTIVE;
# physical state 3 Disabled, 5 LinkUp.
IB_STATE_ACTIVE, IB_STATE_DOWN = 4, 1
IB_PHYS_LINKUP, IB_PHYS_DISABLED = 5, 3


@dataclass(frozen=True)
class LinkStats:
    ifname: str
    present: bool
    operstate: str  # "up", "down", "lowerlayerdown", ... ("absent" when missing)
    carrier_changes: int
    stats: dict[str, int]

    @property
    def up(self) -> bool:
        # node_exporter: node_network_up is 1 when operstate is "up".
        return self.present and self.operstate == "up"


def _read_int(p: Path) -> int:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return 0


def read_link(ifname: str, root: Path = SYS_CLASS_NET) -> LinkStats:
    d = root / ifname
    try:
        operstate = (d / "operstate").read_text().strip()
    except OSError:
        return LinkStats(ifname, False, "absent", 0, dict.fromkeys(STAT_METRICS, 0))
    return LinkStats(
        ifname,
        True,
        operstate,
        _read_int(d / "carrier_changes"),
        {k: _read_int(d / "statistics" / k) for k in STAT_METRICS},
    )
