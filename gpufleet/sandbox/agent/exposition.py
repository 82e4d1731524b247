"""Metric families the agent publishes (pure: state in, prometheus_client families out).

On an AMD or Ascend node the GPU metrics are its vendor's exporter's instead (vendors.py). NVIDIA
GPU metrics use dcgm-exporter's names and labels (gpu, UUID, device, modelName, Hostname,
pci_bus_id). dcgm-exporter writes its counters WITHOUT a `_total` suffix (e.g.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, DCGM_FI_DEV_PCIE_REPLAY_COUNTER); prometheus_client's text writer
always appends `_total` to a counter family's TYPE line, so those families are exposed untyped to
keep the exact sample names dashboards and the catalog's alerts use (rate()/increase() work the
same on untyped series). Fabric metrics are node_exporter's (netclass + netdev collectors) plus an
InfiniBand-style port state derived from the same kernel state, so IB rules work on veth links.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.sandbox.agent import fields as F
from gpufleet.sandbox.agent import host
from gpufleet.sandbox.agent.fabric import (
    IB_PHYS_DISABLED,
    IB_PHYS_LINKUP,
    IB_STATE_ACTIVE,
    IB_STATE_DOWN,
    STAT_METRICS,
    LinkStats,
    port_rate_bytes,
)
from gpufleet.sandbox.agent.state import AgentState
from gpufleet.sandbox.agent.vendors import VendorFormat

DCGM_LABELS = ["gpu", "UUID", "device", "pci_bus_id", "modelName", "Hostname"]


@dataclass(frozen=True)
class Snapshot:
    state: AgentState
    model_name: str
    busy_gpus: frozenset[int]  # GPUs with a live training rank registered
    links: Sequence[LinkStats]
    link_speed_gbps: float | None = None  # the stack's fabric link speed; None: no rate metric
    host: Mapping[str, float] = field(default_factory=dict)  # injected host signals (host.py)
    vendor: VendorFormat | None = None  # None: NVIDIA, dcgm-exporter's format


def gpu_values(snap: Snapshot, gpu: int) -> dict[int, float]:
    """Every published field of one GPU: baseline (idle or busy) overridden by injected values."""
    g = snap.state.gpus[gpu]
    busy = gpu in snap.busy_gpus and not (g.fault is not None and g.fault.fatal)
    out = {fid: (spec.busy if busy else spec.idle) for fid, spec in F.FIELDS.items()}
    # Small per-GPU spread so the GPUs are distinguishable on a dashboard (deterministic).
    out[F.GPU_TEMP] += gpu % 4
    if g.hung_since is not None:
        # Utilization is the share of the sample period in which a kernel was executing (nvidia-smi
        # documentation, "utilization.gpu"): a kernel that never ends reads 100 %, with no progress.
        out[F.GPU_UTIL] = 100.0
    out.update(g.fields)
    return out


def _dcgm_labels(snap: Snapshot, gpu: int) -> list[str]:
    bus = F.pci_bus_id(gpu)  # 0000:18:00 -> dcgm-exporter's 00000000:18:00.0
    return [str(gpu), F.gpu_uuid(snap.state.node, gpu), f"nvidia{gpu}", f"0000{bus}.0", snap.model_name,
            snap.state.node]


def vendor_values(snap: Snapshot, gpu: int) -> dict[str, float]:
    """Every series the vendor's exporter publishes for one GPU: baseline, then injected values,
    then the link-following series at 0 while the GPU's rail is down (GPU i on rail i mod rails)."""
    fmt = snap.vendor
    assert fmt is not None
    g = snap.state.gpus[gpu]
    busy = gpu in snap.busy_gpus and not (g.fault is not None and g.fault.fatal)
    out = {name: (s.busy if busy else s.idle) for name, s in fmt.series.items()}
    out.update(g.metrics)
    link_up = snap.links[gpu % len(snap.links)].up if snap.links else True
    for name, s in fmt.series.items():
        if s.follows_link and not link_up:
            out[name] = 0.0
    return out


def vendor_families(snap: Snapshot) -> list[Metric]:
    """The vendor's exporter's GPU series (both vendors' are gauges: exporters.yaml)."""
    fmt = snap.vendor
    assert fmt is not None
    values = [vendor_values(snap, g.index) for g in snap.state.gpus]
    out: list[Metric] = []
    for name, s in fmt.series.items():
        fam = GaugeMetricFamily(name, s.help, labels=list(fmt.labels))
        for g in snap.state.gpus:
            labels = list(fmt.label_values(snap.state.node, g.index, fmt.model_label))
            fam.add_metric(labels, values[g.index][name])
        out.append(fam)
    return out


def families(snap: Snapshot) -> list[Metric]:
    if snap.vendor is not None:
        return (vendor_families(snap) + link_families(snap.links, snap.link_speed_gbps)
                + host.families(snap.host, [link.ifname for link in snap.links]))
    out: list[Metric] = []
    per_gpu = [gpu_values(snap, g.index) for g in snap.state.gpus]
    for fid, spec in F.FIELDS.items():
        fam: Metric
        if spec.kind == "gauge":
            fam = GaugeMetricFamily(spec.metric, spec.help, labels=DCGM_LABELS)
            for g in snap.state.gpus:
                fam.add_metric(_dcgm_labels(snap, g.index), per_gpu[g.index][fid])
        else:
            fam = Metric(spec.metric, spec.help, "unknown")
            for g in snap.state.gpus:
                fam.add_sample(spec.metric, dict(zip(DCGM_LABELS, _dcgm_labels(snap, g.index), strict=True)),
                               per_gpu[g.index][fid])
        out.append(fam)
    xc = Metric(F.XID_COUNT_METRIC, "Count of XID errors since the last GPU reset, by XID.", "unknown")
    for g in snap.state.gpus:
        for xid, n in sorted(g.xid_counts.items()):
            labels = dict(zip(DCGM_LABELS, _dcgm_labels(snap, g.index), strict=True))
            xc.add_sample(F.XID_COUNT_METRIC, {**labels, "xid": str(xid)}, float(n))
    out.append(xc)
    out += link_families(snap.links, snap.link_speed_gbps)
    out += host.families(snap.host, [link.ifname for link in snap.links])
    return out


def link_families(links: Iterable[LinkStats], link_speed_gbps: float | None = None) -> list[Metric]:
    links = list(links)
    up = GaugeMetricFamily("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.",
                           labels=["device"])
    present = GaugeMetricFamily("gpufleet_agent_fabric_interface_present",
                                "1 if the configured fabric interface exists in the node's namespace.",
                                labels=["device"])
    carrier = CounterMetricFamily("node_network_carrier_changes_total",
                                  "Network device property: carrier_changes_total", labels=["device"])
    stats = {
        f: CounterMetricFamily(m, f"Network device statistic {f}.", labels=["device"])
        for f, m in STAT_METRICS.items()
    }
    ib = GaugeMetricFamily("node_infiniband_state_id",
                           "State of the port (1 DOWN, 4 ACTIVE), derived from the fabric link state.",
                           labels=["device", "port"])
    ibp = GaugeMetricFamily("node_infiniband_physical_state_id",
                            "Physical state of the port (3 Disabled, 5 LinkUp), derived from the link state.",
                            labels=["device", "port"])
    rate = GaugeMetricFamily("node_infiniband_rate_bytes_per_second",
                             "Port rate: the fabric's link speed, or the kernel's tbf rate limit on the "
                             "link when lower (the sandbox's stand-in for a port at reduced width/speed).",
                             labels=["device", "port"])
    for link in links:
        if link_speed_gbps is not None and link.present:
            rate.add_metric([link.ifname, "1"], port_rate_bytes(link_speed_gbps, link.shaped_rate))
        up.add_metric([link.ifname], 1.0 if link.up else 0.0)
        present.add_metric([link.ifname], 1.0 if link.present else 0.0)
        carrier.add_metric([link.ifname], float(link.carrier_changes))
        for f, fam in stats.items():
            fam.add_metric([link.ifname], float(link.stats.get(f, 0)))
        ib.add_metric([link.ifname, "1"], float(IB_STATE_ACTIVE if link.up else IB_STATE_DOWN))
        ibp.add_metric([link.ifname, "1"], float(IB_PHYS_LINKUP if link.up else IB_PHYS_DISABLED))
    return [up, present, carrier, *stats.values(), ib, ibp, *([rate] if link_speed_gbps is not None else [])]


class AgentCollector(Collector):
    """prometheus_client custom collector: one fresh snapshot per scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return families(self._snapshot())
