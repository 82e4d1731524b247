"""The workload on a device's alerts (catalog.owners, ADR 0048): which alerts get the owner join,
the recording rules that keep the owner, and the exporters' declarations. The PromQL itself is
exercised by promtool on the generated fixtures (test_catalog_generated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.catalog.exporters import load_exporters
from gpufleet.catalog.generate import default_root
from gpufleet.catalog.owners import alert_owner, outer_by, owned_expr, owner_record
from gpufleet.catalog.rules import alert_owners, recorded_names, rule_groups
from gpufleet.core.errors import InputError

ROOT = default_root()


@pytest.mark.parametrize(("expr", "by"), [
    ("max by (node, Hostname, gpu, UUID) (x) > 0", ["node", "Hostname", "gpu", "UUID"]),
    ("  sum by(node) (x)", ["node"]),
    ("(max by (node, gpu_id) (x)) == 0", ["node", "gpu_id"]),
    ("gpufleet:node_gpus:count < 8", None),
    ("max without (pod) (x)", None),
    ("rate(x[5m]) > 0 and max by (node, gpu) (y)", None),
])
def test_outer_by(expr: str, by: list[str] | None) -> None:
    assert outer_by(expr) == by


def test_every_single_device_alert_of_each_exporter_gets_its_owner() -> None:
    owners = alert_owners(load_catalog())
    by_record: dict[str, set[str]] = {}
    for alert, owner in owners.items():
        by_record.setdefault(owner.record, set()).add(alert)
    assert by_record["gpufleet:amd_gpu_owner:last_seen"] == {
        "AmdGpuUnhealthy", "AmdGpuUncorrectableEcc", "AmdGpuCorrectableEccRate", "AmdGpuPcieReplayRate"}
    assert by_record["gpufleet:npu_owner:last_seen"] == {
        "AscendNpuUnhealthy", "AscendHbmUncorrectableEcc", "AscendNpuLinkDown", "AscendNpuNetworkUnhealthy"}
    nvidia = by_record["gpufleet:gpu_owner:last_seen"]
    # Latched alerts read a recording rule: the owner is found through it.
    assert {"GpuFallenOffBus", "GpuDoubleBitEccError", "GpuOverTemperature"} <= nvidia
    assert len(nvidia) == 19
    # Per node, not per device: no owner to name.
    assert "GpuXid45Storm" not in owners and "GpuMissing" not in owners
    # No fabric, node or workload alert is joined with a GPU's owner.
    assert all(a.startswith(("Gpu", "Amd", "Ascend")) for a in owners)


def test_an_alert_reading_two_exporters_or_no_device_gets_none() -> None:
    ex = load_exporters()
    two = "max by (node, gpu, UUID, gpu_id, serial_number) (DCGM_FI_DEV_GPU_TEMP + gpu_health)"
    assert alert_owner(two, ex, {}) is None
    assert alert_owner("max by (node) (DCGM_FI_DEV_GPU_TEMP)", ex, {}) is None
    assert alert_owner("max by (node, gpu, UUID) (node_load1)", ex, {}) is None


def test_each_owner_record_is_written_once_before_the_first_alert_that_reads_it() -> None:
    flat = [r for g in rule_groups(load_catalog()) for r in g["rules"]]
    names = [r.get("record") or r["alert"] for r in flat]
    for record in ("gpufleet:gpu_owner:last_seen", "gpufleet:amd_gpu_owner:last_seen",
                   "gpufleet:npu_owner:last_seen"):
        assert names.count(record) == 1
        first = next(i for i, r in enumerate(flat) if "alert" in r and record in r["expr"])
        assert names[first - 1] == record
    assert {"gpufleet:gpu_owner:last_seen", "gpufleet:npu_owner:last_seen"} <= recorded_names(load_catalog())


def test_the_join_keeps_the_alert_without_an_owner_and_the_record_bounds_what_it_keeps() -> None:
    owner = load_exporters().exporters["dcgm-exporter"].owner
    assert owner is not None
    expr = owned_expr("max by (node, Hostname, gpu, UUID, modelName) (DCGM_FI_DEV_GPU_TEMP) >= 87", owner)
    joined, kept = expr.split("\nor on (node, gpu, UUID) ")
    assert "group_left (namespace, pod) (0 * gpufleet:gpu_owner:last_seen + 1)" in joined
    assert ">= 87" in kept  # the same alert, unjoined, for a GPU without a known owner
    rec = owner_record(owner)["expr"]
    assert 'DCGM_FI_DEV_GPU_TEMP{exported_pod!=""}' in rec
    assert "topk by (node, gpu, UUID) (1," in rec  # one owner per GPU: group_left cannot fail
    assert "gpufleet:gpu_owner:last_seen > time() - 3600" in rec
    assert "unless on (node, gpu, UUID) DCGM_FI_DEV_GPU_TEMP" in rec


@pytest.mark.parametrize(("old", "new", "message"), [
    ("owner: {series: DCGM_FI_DEV_GPU_TEMP,", "owner: {series: gpu_health,",
     "owner.series: gpu_health is not a series of this exporter"),
    ("keys: [node, gpu, UUID], namespace: exported_namespace, pod: exported_pod",
     "keys: [node, gpu, uuid], namespace: exported_namespace, pod: exported_pod",
     "owner.keys: uuid not among the exporter's labels"),
])
def test_a_wrong_owner_declaration_is_refused_with_its_path(tmp_path: Path, old: str, new: str,
                                                              message: str) -> None:
    text = (ROOT / "gpufleet/catalog/exporters.yaml").read_text()
    assert old in text
    bad = tmp_path / "exporters.yaml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as e:
        load_exporters(bad)
    rendered = e.value.render()
    assert str(bad) in rendered and "dcgm-exporter" in rendered and message in rendered
