"""Fabric link state read from the kernel, as node_exporter's netclass/netdev collectors read it.

/sys/class/net shows the interfaces of the network namespace that MOUNTED /sys, not of the reading
process: start the agent with `ip netns exec <ns>` (which remounts /sys for the namespace), or the
agent reads the root namespace's links. A configured interface that does not exist is reported
down (a missing port is a down port), never silently skipped.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # Bytes/s the root qdisc lets through when it is a rate limiter (tbf), else None: the sandbox's
    # analogue of a port that retrained at reduced width/speed (see port_rate_bytes).
    shaped_rate: float | None = None

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


# --------------------------------------------------------------------------- port rate


def tbf_rate(tc_json: Any) -> float | None:
    """The rate (bytes/s) of a root `tbf` qdisc in `tc -j qdisc show dev <if>` output, else None.

    iproute2's JSON prints tbf's `options.rate` in bytes per second (`rate 50mbit` -> 6250000)."""
    if not isinstance(tc_json, list):
        return None
    for q in tc_json:
        if isinstance(q, dict) and q.get("kind") == "tbf" and q.get("root"):
            rate = (q.get("options") or {}).get("rate")
            if isinstance(rate, int | float) and rate > 0:
                return float(rate)
    return None


def read_shaped_rate(ifname: str, tc: str = "tc") -> float | None:
    """Ask the kernel (rtnetlink via `tc -j qdisc show`) for the rate limit on the interface. Runs
    in the caller's network namespace (the agent's is the node's). Unreadable -> None (not shaped)."""
    try:
        res = subprocess.run([tc, "-j", "qdisc", "show", "dev", ifname], capture_output=True, text=True,
                             timeout=2, check=False)
        return tbf_rate(json.loads(res.stdout)) if res.returncode == 0 and res.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def port_rate_bytes(link_speed_gbps: float, shaped_rate: float | None) -> float:
    """node_infiniband_rate_bytes_per_second for a sandbox port: the stack's link speed, or the
    kernel's rate limit on the veth when that is lower. A real HCA reports the rate it negotiated
    (e.g. NDR 4x = 400 Gb/s, 2x after a lane fails); the sandbox has no lanes, and a `tc tbf` rate on
    the link is the kernel-enforced stand-in for "this port now carries less"."""
    full = link_speed_gbps * 1e9 / 8
    return full if shaped_rate is None else min(full, shaped_rate)
