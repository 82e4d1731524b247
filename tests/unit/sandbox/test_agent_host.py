"""Host signals of the node agent: parsing, applying, the exporters' series, and the health check's
verdict on them."""

from __future__ import annotations

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from gpufleet.catalog import load_catalog
from gpufleet.health.decide import evaluate, host_findings, link_findings
from gpufleet.health.observe import LinkReading, Observations
from gpufleet.sandbox.agent import host


def test_parse_and_apply() -> None:
    inj = host.parse_host_injection({"signal": "edac-ue", "add": 1, "kill_processes": True})
    assert inj == host.HostInjection("edac-ue", None, 1.0, True)
    values = host.apply(host.apply({}, inj), inj)
    assert values == {"edac-ue": 2.0}
    assert host.apply(values, host.parse_host_injection({"signal": "psu-state", "value": 2})) == {
        "edac-ue": 2.0, "psu-state": 2.0}


@pytest.mark.parametrize(("body", "why"), [
    ({"signal": "fan"}, "signal must be one of"),
    ({"signal": "psu-state"}, "exactly one of value and add"),
    ({"signal": "psu-state", "value": 2, "add": 1}, "exactly one of value and add"),
    ({"signal": "psu-state", "value": -1}, "value must be a number >= 0"),
    ({"signal": "psu-state", "value": True}, "value must be a number >= 0"),
    ({"signal": "psu-state", "value": 2, "boom": 1}, "unknown keys"),
    ({"signal": "edac-ue", "add": 1, "kill_processes": "yes"}, "kill_processes"),
    ([], "JSON object"),
])
def test_parse_rejects(body: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        host.parse_host_injection(body)


def test_families_use_the_stock_exporters_names() -> None:
    class C:
        def collect(self):  # type: ignore[no-untyped-def]
            return host.families({"psu-state": 2, "edac-ue": 3, "symbol-errors": 100, "fs-readonly": 1},
                                 ["fab0"])

    reg = CollectorRegistry()
    reg.register(C())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    # ipmi_exporter: 0 nominal, 2 critical; only the first PSU of the pair failed.
    assert 'ipmi_sensor_state{id="1",name="PSU1",type="Power Supply"} 2.0' in text
    assert 'ipmi_sensor_state{id="2",name="PSU2",type="Power Supply"} 0.0' in text
    assert 'ipmi_sensor_state{id="3",name="CPU0",type="Processor"} 0.0' in text
    assert 'node_edac_uncorrectable_errors_total{controller="0"} 3.0' in text
    assert 'node_filesystem_readonly{device="/dev/nvme0n1p1",fstype="ext4",mountpoint="/local"} 1.0' in text
    assert 'node_infiniband_symbol_error_total{device="fab0",port="1"} 100.0' in text


CAT = load_catalog()


def obs(**kw: object) -> Observations:
    base: dict[str, object] = dict(node="gpu-0", now=100.0, gpus=(), links=(LinkReading("fab0", True, "up"),))
    base.update(kw)
    return Observations(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("signal", "value", "fault", "drains"), [
    ("psu-state", 2.0, "node-psu-failure", True),
    ("cpu-state", 2.0, "node-cpu-failure", True),
    ("edac-ue", 1.0, "node-memory-failure", True),
    ("fs-readonly", 1.0, "node-ssd-failure", True),
    ("symbol-errors", 100.0, "fabric-symbol-errors", False),  # action none: a warning only
])
def test_host_signals_map_to_their_catalog_fault(signal: str, value: float, fault: str, drains: bool) -> None:
    (f,) = host_findings(obs(host={signal: value}), CAT)
    assert f.fault_id == fault
    v = evaluate(obs(host={signal: value}), CAT, {})
    assert (v.status == "problem") is drains
    assert host_findings(obs(host={signal: 0.0}), CAT) == []
    assert host_findings(obs(host=None), CAT) == []


def test_an_absent_port_is_a_failed_nic_and_a_down_port_is_port_down() -> None:
    absent = link_findings(obs(links=(LinkReading("fab0", False, "absent"),)), CAT)
    down = link_findings(obs(links=(LinkReading("fab0", False, "down"),)), CAT)
    assert [f.fault_id for f in absent] == ["fabric-nic-failure"]
    assert [f.fault_id for f in down] == ["fabric-port-down"]
