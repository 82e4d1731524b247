"""The agent's exposition: dcgm-exporter names and labels, node_exporter fabric metrics from sysfs."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.sandbox.agent.exposition import AgentCollector, Snapshot
from gpufleet.sandbox.agent.fabric import read_link
from gpufleet.sandbox.agent.state import Injection, initial_state, inject

CAT = load_catalog()
RULES = xid_policy(CAT, {})[0]


def fake_sysfs(root: Path, name: str, operstate: str, carrier_changes: int, rx_bytes: int) -> None:
    d = root / name
    (d / "statistics").mkdir(parents=True)
    (d / "operstate").write_text(operstate + "\n")
    (d / "carrier_changes").write_text(f"{carrier_changes}\n")
    for f in ("rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
        (d / "statistics" / f).write_text(f"{rx_bytes if f == 'rx_bytes' else 3}\n")


def render(snap: Snapshot) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(lambda: snap))
    return generate_latest(reg).decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def find(sm: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in sm.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_dcgm_metrics_exact_names_labels_and_injected_values(tmp_path: Path) -> None:
    fake_sysfs(tmp_path, "fab0", "up", 2, 1000)
    s, _ = inject(initial_state("gpu-3", 8, 0.0), Injection(3, 230, 79, kmsg=True), CAT, RULES, 1.0)
    s, _ = inject(s, Injection(3, 230, 45, burst=4), CAT, RULES, 2.0)
    s, _ = inject(s, Injection(1, 311, 2), CAT, RULES, 3.0)
    text = render(Snapshot(s, "NVIDIA H100 80GB HBM3", frozenset({0}), [read_link("fab0", tmp_path)]))
    sm = samples(text)
    xid3 = [dict(ls) for (n, ls) in sm if n == "DCGM_FI_DEV_XID_ERRORS" and dict(ls)["gpu"] == "3"]
    assert len(xid3) == 1
    assert set(xid3[0]) == {"gpu", "UUID", "device", "pci_bus_id", "modelName", "Hostname"}
    assert xid3[0]["device"] == "nvidia3" and xid3[0]["Hostname"] == "gpu-3"
    assert xid3[0]["modelName"] == "NVIDIA H100 80GB HBM3"
    assert xid3[0]["pci_bus_id"] == "00000000:5d:00.0"
    assert find(sm, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 45  # last XID, never reset
    assert find(sm, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="79") == 1
    assert find(sm, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="45") == 4
    assert find(sm, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1") == 2
    assert find(sm, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="2") == 0
    # Busy GPU 0 runs hot; idle GPU 2 does not; 8 GPUs each.
    assert find(sm, "DCGM_FI_DEV_GPU_UTIL", gpu="0") > 50 > find(sm, "DCGM_FI_DEV_GPU_UTIL", gpu="2")
    assert len([1 for (n, _) in sm if n == "DCGM_FI_DEV_GPU_TEMP"]) == 8
    # dcgm-exporter names have no _total suffix added.
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total" not in text
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text


def test_fabric_metrics_follow_kernel_state(tmp_path: Path) -> None:
    fake_sysfs(tmp_path, "fab0", "up", 2, 1000)
    fake_sysfs(tmp_path, "fab1", "lowerlayerdown", 5, 7)
    links = [read_link(n, tmp_path) for n in ("fab0", "fab1", "fab9")]
    sm = samples(render(Snapshot(initial_state("n", 1, 0.0), "NVIDIA H100 80GB HBM3", frozenset(), links)))
    assert find(sm, "node_network_up", device="fab0") == 1
    assert find(sm, "node_network_up", device="fab1") == 0
    assert find(sm, "node_network_up", device="fab9") == 0  # a missing port is a down port
    assert find(sm, "gpufleet_agent_fabric_interface_present", device="fab9") == 0
    assert find(sm, "node_network_carrier_changes_total", device="fab1") == 5
    assert find(sm, "node_network_receive_bytes_total", device="fab0") == 1000
    assert find(sm, "node_network_receive_drop_total", device="fab0") == 3
    assert find(sm, "node_infiniband_state_id", device="fab0", port="1") == 4
    assert find(sm, "node_infiniband_state_id", device="fab1", port="1") == 1
    assert find(sm, "node_infiniband_physical_state_id", device="fab1", port="1") == 3


def test_port_rate_is_the_link_speed_or_the_kernel_tbf_rate(tmp_path: Path) -> None:
    """node_infiniband_rate_bytes_per_second: the stack's link speed, lowered to a tbf rate limit
    (what `tc -j qdisc show` reports, in bytes/s) - what the FabricLinkDegraded alert compares."""
    import dataclasses

    from gpufleet.sandbox.agent.fabric import tbf_rate

    tc_out = [{"kind": "tbf", "handle": "8003:", "root": True, "refcnt": 3,
               "options": {"rate": 6250000, "burst": 4093, "lat": 400000}}]
    assert tbf_rate(tc_out) == 6_250_000.0  # `tc qdisc add ... tbf rate 50mbit`
    assert tbf_rate([]) is None  # veth default: noqueue, printed as []
    assert tbf_rate([{"kind": "tbf", "root": False, "options": {"rate": 5}}]) is None  # not the root
    assert tbf_rate({"kind": "tbf"}) is None
    fake_sysfs(tmp_path, "fab0", "up", 2, 1000)
    fake_sysfs(tmp_path, "fab1", "up", 2, 1000)
    links = [
        dataclasses.replace(read_link("fab0", tmp_path), shaped_rate=6_250_000.0),
        read_link("fab1", tmp_path),
        read_link("fab9", tmp_path),
    ]
    st = initial_state("n", 1, 0.0)
    sm = samples(render(Snapshot(st, "NVIDIA H100 80GB HBM3", frozenset(), links, 100)))
    assert find(sm, "node_infiniband_rate_bytes_per_second", device="fab0", port="1") == 6_250_000
    assert find(sm, "node_infiniband_rate_bytes_per_second", device="fab1", port="1") == 12.5e9
    rate = "node_infiniband_rate_bytes_per_second"
    assert not [k for k in sm if k[0] == rate and ("device", "fab9") in k[1]]
    # Without a configured link speed the agent publishes no rate at all (never a made-up one).
    sm = samples(render(Snapshot(st, "NVIDIA H100 80GB HBM3", frozenset(), links)))
    assert not [k for k in sm if k[0] == "node_infiniband_rate_bytes_per_second"]
