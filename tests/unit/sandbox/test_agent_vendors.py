"""The node agent on AMD and Ascend nodes: their exporters' series names, labels and polarity,
injections of those series classified by the catalog's exporter-field checks, the series that
follow the fabric link, and the node health check reading the same values."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.catalog.exporters import load_exporters
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.health import decide
from gpufleet.health.observe import Observations
from gpufleet.health.sources import agent_readings, parse_exporter
from gpufleet.sandbox.agent.exposition import AgentCollector, Snapshot
from gpufleet.sandbox.agent.fabric import read_link
from gpufleet.sandbox.agent.state import (
    Injection,
    MetricInjection,
    from_json,
    health_doc,
    initial_state,
    inject,
    parse_injection,
    to_json,
)
from gpufleet.sandbox.agent.vendors import AMD, NPU, vendor_format

CAT = load_catalog()
RULES = xid_policy(CAT, {})[0]
EXPORTERS = load_exporters().exporters


def _sysfs(root: Path, name: str, operstate: str) -> None:
    d = root / name
    (d / "statistics").mkdir(parents=True)
    (d / "operstate").write_text(operstate + "\n")
    (d / "carrier_changes").write_text("2\n")
    for f in ("rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
        (d / "statistics" / f).write_text("0\n")


def _render(snap: Snapshot) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(lambda: snap))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            key = s.labels.get("gpu_id") or s.labels.get("id") or s.labels.get("gpu") or ""
            out[(s.name, key)] = (dict(s.labels), s.value)
    return out


def test_vendor_of_each_model() -> None:
    assert vendor_format(AcceleratorModel.MI300X) is AMD
    assert vendor_format(AcceleratorModel.ASCEND_910B) is NPU
    assert vendor_format(AcceleratorModel.H100_SXM) is None


@pytest.mark.parametrize("fmt", [AMD, NPU])
def test_the_agent_publishes_what_the_exporter_declares(fmt: object) -> None:
    from gpufleet.sandbox.agent.vendors import VendorFormat

    assert isinstance(fmt, VendorFormat)
    declared = EXPORTERS[fmt.exporter]
    assert list(fmt.labels) == declared.labels  # the exporter's labels, in its order
    assert set(declared.series) <= set(fmt.series)  # every series the catalog may read


def test_amd_node_series_labels_and_an_injected_fault(tmp_path: Path) -> None:
    _sysfs(tmp_path, "fab0", "up")
    s = initial_state("gpu-1", 8, 0.0)
    s, events = inject(s, MetricInjection(2, "gpu_health", 0), CAT, RULES, 5.0)
    assert events == []
    fault = s.gpus[2].fault
    assert fault is not None and fault.fatal and fault.fault_id == "amd-gpu-unhealthy"
    assert s.gpus[2].fault_since == 5.0 and "gpu_health=0" in fault.error
    sm = _render(Snapshot(s, AMD.model_label, frozenset({0}), [read_link("fab0", tmp_path)], vendor=AMD))
    labels, value = sm[("gpu_health", "2")]
    assert value == 0
    assert set(labels) == set(AMD.labels)
    assert labels["hostname"] == "gpu-1" and labels["card_model"] == "MI300X"
    assert sm[("gpu_health", "3")][1] == 1  # healthy is 1
    assert sm[("gpu_junction_temperature", "0")][1] == 78  # busy
    assert sm[("gpu_junction_temperature", "1")][1] == 40  # idle
    assert not any(name.startswith("DCGM_") for name, _ in sm)  # no NVIDIA series on an AMD node
    assert ("node_network_up", "") in sm  # node_exporter's fabric series stay


def test_a_non_fatal_value_is_published_but_no_fault(tmp_path: Path) -> None:
    s, _ = inject(initial_state("gpu-1", 8, 0.0), MetricInjection(0, "gpu_junction_temperature", 90),
                  CAT, RULES, 1.0)
    assert s.gpus[0].fault is None and s.gpus[0].metrics == {"gpu_junction_temperature": 90.0}
    assert health_doc(s)["gpus"] == {}


def test_ascend_link_series_follow_the_npus_rail(tmp_path: Path) -> None:
    _sysfs(tmp_path, "fab0", "down")
    s = initial_state("gpu-0", 8, 0.0)
    sm = _render(Snapshot(s, NPU.model_label, frozenset(), [read_link("fab0", tmp_path)], vendor=NPU))
    assert sm[("npu_chip_info_link_status", "5")][1] == 0
    assert sm[("npu_chip_info_network_status", "5")][1] == 0
    assert sm[("npu_chip_info_health_status", "5")][1] == 1  # the chip itself is healthy
    labels = sm[("npu_chip_info_link_status", "5")][0]
    assert labels["model_name"] == "Ascend910B" and labels["pcie_bus_info"] == "0000:C6:00.0"


def test_injections_are_checked_against_the_nodes_vendor() -> None:
    assert parse_injection({"gpu": 1, "metric": "npu_chip_info_health_status", "value": 0}, 8, NPU) == \
        MetricInjection(1, "npu_chip_info_health_status", 0.0)
    with pytest.raises(ValueError, match="not published by npu-exporter"):
        parse_injection({"gpu": 1, "metric": "gpu_health", "value": 0}, 8, NPU)
    with pytest.raises(ValueError, match="take the link down instead"):
        parse_injection({"gpu": 1, "metric": "npu_chip_info_link_status", "value": 0}, 8, NPU)
    with pytest.raises(ValueError, match="no DCGM fields"):
        parse_injection({"gpu": 1, "field_id": 230, "value": 79}, 8, AMD)
    with pytest.raises(ValueError, match="NVIDIA's"):
        parse_injection({"gpu": 1, "metric": "gpu_health", "value": 0}, 8, None)
    with pytest.raises(ValueError, match="unknown keys: kmsg"):
        parse_injection({"gpu": 1, "metric": "gpu_health", "value": 0, "kmsg": True}, 8, AMD)
    assert isinstance(parse_injection({"gpu": 0, "field_id": 230, "value": 79}, 8, None), Injection)


def test_state_round_trip_keeps_vendor_series() -> None:
    ecc = MetricInjection(4, "npu_chip_info_hbm_ecc_double_bit_error_cnt", 3)
    s, _ = inject(initial_state("gpu-2", 8, 0.0), ecc, CAT, RULES, 2.0)
    back = from_json(to_json(s), "gpu-2", 8, 9.0)
    assert back.gpus[4].metrics == {"npu_chip_info_hbm_ecc_double_bit_error_cnt": 3.0}
    assert back.gpus[4].fault is not None and back.gpus[4].fault.fault_id == "ascend-hbm-ecc-uncorrectable"


def test_node_health_drains_on_the_same_series() -> None:
    doc = {"gpus": [{"index": 0, "fields": {}, "metrics": {"gpu_ecc_uncorrect_total": 2.0}},
                    {"index": 1, "fields": {}, "metrics": {"gpu_ecc_uncorrect_total": 0.0}}]}
    gpus, _, _ = agent_readings(doc)
    obs = Observations("gpu-1", 100.0, tuple(gpus))
    found = decide.field_findings(obs, CAT)
    assert [(f.fault_id, f.gpu) for f in found] == [("amd-gpu-ecc-uncorrectable", 0)]
    assert found[0].detail == "gpu_ecc_uncorrect_total = 2 > 0"


def test_node_health_reads_a_real_exporters_text() -> None:
    text = (
        "# HELP gpu_health Health of the GPU\n# TYPE gpu_health gauge\n"
        'gpu_health{gpu_id="0",serial_number="X",card_model="c",hostname="h",gpu_partition_id="0",'
        'gpu_compute_partition_type="spx"} 1\n'
        'gpu_health{gpu_id="1",serial_number="Y",card_model="c",hostname="h",gpu_partition_id="0",'
        'gpu_compute_partition_type="spx"} 0\n'
        "# TYPE node_load1 gauge\nnode_load1 0.5\n"
    )
    gpus = parse_exporter(text)
    assert [(g.index, g.metrics) for g in gpus] == [(0, {"gpu_health": 1.0}), (1, {"gpu_health": 0.0})]
    found = decide.field_findings(Observations("h", 0.0, tuple(gpus)), CAT)
    assert [(f.fault_id, f.gpu) for f in found] == [("amd-gpu-unhealthy", 1)]
