"""What each shipped stack deploys produces what its rules read (issue 17): the dcgm-exporter
collectors file the GPU Operator release carries, the `node` relabelling on the ServiceMonitors,
the rules rendered for the stack, and per stack the alerts no deployed exporter feeds."""

from __future__ import annotations

import re
from typing import Any

import pytest
from infra_testdata import shipped

from gpufleet.catalog import load_catalog
from gpufleet.catalog.exporters import COLLECTORS_FILE, collected_fields, collectors_csv, load_exporters
from gpufleet.catalog.generate import default_root
from gpufleet.catalog.promql import metric_names
from gpufleet.catalog.rules import RuleSettings, rule_groups
from gpufleet.config import load_stack
from gpufleet.config.placement import LEAF_LABEL
from gpufleet.infra.gpu_software import DCGM_METRICS_CONFIGMAP
from gpufleet.infra.monitoring import LEAF_RELABELING, NODE_RELABELING, rule_settings
from gpufleet.infra.platform import vendors
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
    monitor = prom["prometheus-node-exporter"]["prometheus"]["monitor"]
    assert monitor["relabelings"] == NODE_RELABELING + LEAF_RELABELING
    assert monitor["attachMetadata"] == {"node": True}  # the node's labels, for `leaf`
    # Prometheus sanitises a node label's name into its meta label: gpufleet.io/leaf.
    assert LEAF_RELABELING[0]["sourceLabels"] == [
        "__meta_kubernetes_node_label_" + re.sub(r"[^A-Za-z0-9_]", "_", LEAF_LABEL)]


def test_rules_deployed_for_a_stack_read_its_declared_fabric() -> None:
    spec, view = shipped("h200-ib")
    rules = {r["alert"]: r for r in _rules(view) if "alert" in r}
    hcas = "|".join(spec.fabric.hca_names())
    assert f'node_infiniband_state_id{{device=~"{hcas}"}}' in rules["FabricPortDown"]["expr"]
    assert rules["FabricPortDown"]["for"] == "1m"  # two scrapes of the stack's 30 s
    assert "< 5e+10" in rules["FabricLinkDegraded"]["expr"]  # 400 Gb/s declared


# Alerts whose series no exporter the stack deploys produces, and why: checked both ways, so a
# stack that starts (or stops) feeding an alert fails here until this table says so. Series of
# another vendor's exporter are absent by design (an `or` arm for the vendor the stack lacks); an
# alert that reads only those is not for the stack and is left out.
_BMC = {"NodePowerSupplyFailure", "NodeCpuFailure"}  # ipmi_exporter: the operator's
_DISK = {"NodeLocalDiskFailure"}  # smartctl_exporter: the operator's
_PROBES = {"StorageObjectStoreDown", "StorageMetadataEngineDown"}  # blackbox probes: the operator's
_CEPH = {"StorageCephOsdDown", "StorageCephOsdNearFull", "StorageCephOsdFull"}  # the mgr module Rook enables
_AMD = {"AmdGpuUnhealthy", "AmdGpuUncorrectableEcc", "AmdGpuCorrectableEccRate", "AmdGpuPcieReplayRate"}
_ASCEND = {"AscendNpuUnhealthy", "AscendHbmUncorrectableEcc", "AscendNpuLinkDown",
           "AscendNpuNetworkUnhealthy"}


def _expected_gaps(stack: str) -> set[str]:
    gaps = _BMC | _DISK | _PROBES
    if stack == "ascend-910b-roce":
        # No npu-exporter is deployed.
        gaps |= _ASCEND | {"GpuMissing", "FabricNicMissing"}
    if stack in ("scale-10k", "ascend-910b-roce", "sandbox"):
        gaps |= _CEPH  # no Rook on these stacks
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
    monitors = {r.inputs["metadata"]["name"]: r.inputs["spec"]
                for r in view.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor")}
    amd = [r for r in view.of_type("kubernetes:amd.com/v1alpha1:DeviceConfig")
           if r.inputs["spec"]["metricsExporter"]["enable"]]
    if amd and "amd-metrics-exporter" in monitors:
        # Every field is exported when the DeviceConfig names no field list (its config is unset).
        assert "config" not in amd[0].inputs["spec"]["metricsExporter"]
        endpoint = monitors["amd-metrics-exporter"]["podMetricsEndpoints"][0]
        assert endpoint["portNumber"] == amd[0].inputs["spec"]["metricsExporter"]["port"]
        assert endpoint["relabelings"] == NODE_RELABELING
        out |= set(ex["amd-device-metrics-exporter"].series)
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_every_alert_reads_series_the_stack_deploys_an_exporter_for(stack: str) -> None:
    spec, view = shipped(stack)
    rules = _rules(view)
    records = {r["record"]: str(r["expr"]) for r in rules if "record" in r}
    produced = _produced(view)
    exporters = load_exporters()
    ours = {v.value for v in vendors(spec)}

    def leaves(expr: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for n in metric_names(expr):
            if n in records:
                out |= set() if n in seen else leaves(records[n], seen | {n})
            else:
                out.add(n)
        return out

    def vendor_of(name: str) -> str | None:
        found = exporters.producer(name)
        return found[1].vendor if found is not None else None

    gaps, not_ours = set(), set()
    for r in rules:
        if "alert" not in r:
            continue
        names = leaves(str(r["expr"]))
        vendored = {n for n in names if vendor_of(n) is not None}
        if vendored and all(vendor_of(n) not in ours for n in vendored):
            not_ours.add(r["alert"])
        elif not {n for n in names if vendor_of(n) in (None, *ours)} <= produced:
            gaps.add(r["alert"])
    assert gaps == _expected_gaps(stack)
    by_vendor = _vendor_alerts()
    assert not_ours == set().union(*(by_vendor[v] for v in ("nvidia", "amd", "huawei") if v not in ours))


def _vendor_alerts() -> dict[str, set[str]]:
    """Alerts about one vendor's accelerators, from the catalog: the NVIDIA ones are the GPU faults
    without a vendor (XIDs and DCGM fields), except GpuMissing, which counts every vendor's."""
    out: dict[str, set[str]] = {"nvidia": set(), "amd": set(), "huawei": set()}
    for f in load_catalog():
        if f.alert is None or f.id == "gpu-missing":
            continue
        if f.vendor is not None:
            out[f.vendor].add(f.alert.name)
        elif f.fault_class.value.startswith("gpu-"):
            out["nvidia"].add(f.alert.name)
    return out


def test_collectors_file_matches_the_catalog() -> None:
    assert collectors_csv(load_exporters()) == (ROOT / COLLECTORS_FILE).read_text()


def test_inhibit_rules_name_catalog_alerts_that_carry_the_equal_labels() -> None:
    """Each inhibit rule's source and named targets are alerts of the catalog whose promtool
    fixtures (the labels the expression yields on real series) carry the labels it matches on."""
    from gpufleet.catalog.promtests import load_fixtures
    from gpufleet.config.model import MonitoringSpec
    from gpufleet.infra.monitoring import INHIBIT_RULES, alertmanager_config

    fixtures = load_fixtures().alerts
    named = re.compile(r'^alertname="([A-Za-z0-9]+)"$')
    for rule in INHIBIT_RULES:
        for matcher in [*rule["source_matchers"], *rule["target_matchers"]]:
            m = named.match(matcher)
            if m:
                assert m.group(1) in fixtures, f"{matcher}: no such alert"
                assert set(rule["equal"]) <= set(fixtures[m.group(1)].labels), (rule, m.group(1))
    # NodeDown silences every other alert of the node: GPU and fabric alerts carry `node`.
    for name in ("GpuFallenOffBus", "GpuOverTemperature", "FabricPortDown", "FabricLinkDegraded"):
        assert "node" in fixtures[name].labels, name
    assert alertmanager_config(MonitoringSpec())["route"]["group_by"] == ["alertname", "node"]


def test_the_stack_sets_the_runbook_base() -> None:
    from infra_testdata import variant

    spec = variant("h200-ib", lambda d: d["monitoring"].update(
        runbookBaseUrl="https://git.internal.example/ops/gpufleet/-/blob/main/runbooks"))
    rules = rule_groups(load_catalog(), rule_settings(spec))
    urls = {r["annotations"]["runbook_url"] for g in rules for r in g["rules"] if "alert" in r}
    assert "https://git.internal.example/ops/gpufleet/-/blob/main/runbooks/GpuFallenOffBus.md" in urls
    assert all(u.startswith("https://git.internal.example/") for u in urls)
