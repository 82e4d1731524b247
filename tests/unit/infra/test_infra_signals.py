"""What each shipped stack deploys produces what its rules read (issue 17): the dcgm-exporter
collectors file the GPU Operator release carries, the `node` relabelling on the ServiceMonitors,
the rules rendered for the stack, and per stack the alerts no deployed exporter feeds."""

from __future__ import annotations

from typing import Any

import pytest
from infra_testdata import shipped

from gpufleet.catalog import load_catalog
from gpufleet.catalog.exporters import COLLECTORS_FILE, collected_fields, collectors_csv, load_exporters
from gpufleet.catalog.generate import default_root
from gpufleet.catalog.promql import metric_names
from gpufleet.catalog.rules import RuleSettings
from gpufleet.config import load_stack
from gpufleet.infra.gpu_software import DCGM_METRICS_CONFIGMAP
from gpufleet.infra.monitoring import NODE_RELABELING, rule_settings
from gpufleet.sandbox.layout import fabric_ifname

ROOT = default_root()
STACKS = ["h200-ib", "b200-roce", "scale-10k", "mi300x-roce", "ascend-910b-roce", "sandbox"]


def _release(view: Any, name: str) -> dict[str, Any] | None:
    found = [r for r in view.of_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == name]
    return found[0].inputs["values"] if found else None


def _rules(view: Any) -> list[dict[str, Any]]:
    return [r for cr in view.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
            for g in cr.inputs["spec"]["groups"] for r in g["rules"]]


def test_the_committed_rule_file_is_rendered_for_the_sandbox_stack() -> None:
    spec = load_stack(ROOT / "stacks/Pulumi.sandbox.yaml")
    assert rule_settings(spec) == RuleSettings()
    assert fabric_ifname(0) == "fab0"  # the sandbox's naming rule_settings assumes


def test_gpu_operator_deploys_the_catalog_collectors_file_and_the_node_label() -> None:
    _, view = shipped("h200-ib")
    values = _release(view, "gpu-operator")
    assert values is not None
    dcgm = values["dcgmExporter"]
    assert dcgm["config"] == {"name": DCGM_METRICS_CONFIGMAP, "create": True,
                              "data": (ROOT / COLLECTORS_FILE).read_text()}
    assert dcgm["serviceMonitor"]["relabelings"] == NODE_RELABELING
    env = {e["name"]: e["value"] for e in dcgm["env"]}
    assert env["DCGM_EXPORTER_INTERVAL"] == "10000"  # the stack's dcgmScrapeInterval, 10s
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true" and env["DCGM_EXPORTER_LISTEN"] == ":9400"
    prom = _release(view, "kube-prometheus-stack")
    assert prom is not None
    assert prom["prometheus-node-exporter"]["prometheus"]["monitor"]["relabelings"] == NODE_RELABELING


def test_rules_deployed_for_a_stack_read_its_declared_fabric() -> None:
    spec, view = shipped("h200-ib")
    rules = {r["alert"]: r for r in _rules(view) if "alert" in r}
    hcas = "|".join(spec.fabric.hca_names())
    assert f'node_infiniband_state_id{{device=~"{hcas}"}}' in rules["FabricPortDown"]["expr"]
    assert rules["FabricPortDown"]["for"] == "1m"  # two scrapes of the stack's 30 s
    assert "< 5e+10" in rules["FabricLinkDegraded"]["expr"]  # 400 Gb/s declared


# Alerts whose series no exporter the stack deploys produces, and why: checked both ways, so a
# stack that starts (or stops) feeding an alert fails here until this table says so.
_BMC = {"NodePowerSupplyFailure", "NodeCpuFailure"}  # ipmi_exporter: the operator's
_DISK = {"NodeLocalDiskFailure"}  # smartctl_exporter: the operator's
_PROBES = {"StorageObjectStoreDown", "StorageMetadataEngineDown"}  # blackbox probes: the sandbox's


def _gpu_alerts() -> set[str]:
    return {f.alert.name for f in load_catalog() if f.alert and f.fault_class.value.startswith("gpu-")}


def _expected_gaps(stack: str) -> set[str]:
    gaps = _BMC | _DISK | _PROBES
    if stack in ("mi300x-roce", "ascend-910b-roce"):
        # No NVIDIA GPUs: no dcgm-exporter, so no GPU alert, and FabricNicMissing's second arm (a GPU
        # node with no HCA at all) has no GPU count; its first arm still reads node-exporter.
        gaps |= _gpu_alerts() | {"FabricNicMissing"}
    if stack in ("scale-10k", "ascend-910b-roce", "sandbox"):
        gaps |= {"StorageCephOsdDown"}  # no Rook on these stacks
    return gaps


def _produced(view: Any) -> set[str]:
    ex = load_exporters().exporters
    out = set(ex["prometheus"].series) | set(ex["gpufleet-training"].series)
    if _release(view, "kube-prometheus-stack") is not None:
        out |= set(ex["node-exporter"].series)
    gpu = _release(view, "gpu-operator")
    if gpu is not None:
        out |= collected_fields(gpu["dcgmExporter"]["config"]["data"])
    if _release(view, "rook-ceph") is not None:
        out |= set(ex["ceph-mgr"].series)
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_every_alert_reads_series_the_stack_deploys_an_exporter_for(stack: str) -> None:
    _, view = shipped(stack)
    rules = _rules(view)
    records = {r["record"]: str(r["expr"]) for r in rules if "record" in r}
    produced = _produced(view)

    def fed(expr: str, seen: frozenset[str] = frozenset()) -> bool:
        # Strict: every series the alert reads (through its recording rules too; a latch reads
        # itself) is produced.
        return all(n in seen or fed(records[n], seen | {n}) if n in records else n in produced
                   for n in metric_names(expr))

    gaps = {r["alert"] for r in rules if "alert" in r and not fed(str(r["expr"]))}
    assert gaps == _expected_gaps(stack)


def test_collectors_file_matches_the_catalog() -> None:
    assert collectors_csv(load_exporters()) == (ROOT / COLLECTORS_FILE).read_text()
