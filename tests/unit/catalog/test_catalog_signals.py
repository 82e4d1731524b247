"""Where the rules' series come from: the PromQL reader, the exporters' declarations, the deployed
dcgm-exporter collectors file, and the per-stack rendering of the rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import DATA_DIR, load_catalog
from gpufleet.catalog.dashboard import dashboard
from gpufleet.catalog.exporters import (
    COLLECTORS_FILE,
    DCGM_EXPORTER,
    collected_fields,
    collectors_csv,
    load_exporters,
    series_sources,
)
from gpufleet.catalog.generate import check_signals, default_root, readers
from gpufleet.catalog.promql import metric_names
from gpufleet.catalog.rules import RuleSettings, recorded_names, rule_groups, rules_document
from gpufleet.core.errors import InputError

ROOT = default_root()
PROMTOOL = shutil.which("promtool")


@pytest.mark.parametrize(("expr", "names"), [
    ('max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS == 79 and changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0)',
     {"DCGM_FI_DEV_XID_ERRORS"}),
    ('sum by (node) (DCGM_EXP_XID_ERRORS_COUNT{xid!~"45|"}) > 0 unless on (node) up{job="x"} == 0',
     {"DCGM_EXP_XID_ERRORS_COUNT", "up"}),
    ("a:b:c < on (node) group_left max by (node) (node_boot_time_seconds) offset 1h",
     {"a:b:c", "node_boot_time_seconds"}),
    ("rate(x_total[5m]) / 1e6 > 0.5 or vector(0) + time()", {"x_total"}),
    ('count by (instance) ({__name__="node_network_up", device="ib0"})', {"node_network_up"}),
    ('label_replace(foo, "dst", "$1", "src", "(.*)") * on (a) group_left (b, c) bar', {"foo", "bar"}),
])
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_regex_on_the_metric_name_is_refused() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"DCGM_.*"}')


def test_every_series_read_is_declared_by_an_exporter() -> None:
    catalog = load_catalog()
    check_signals(catalog, load_exporters(), dashboard(catalog))  # raises on the first gap


def test_a_rule_reading_a_field_the_collectors_file_lacks_is_refused(tmp_path: Path) -> None:
    """A rule on DCGM_FI_DEV_THERMAL_VIOLATION, which the deployed file does not list, is refused
    with the alert and the field named (the CLI turns this into exit 2)."""
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    gpu = data / "gpu.yaml"
    gpu.write_text(gpu.read_text().replace(
        "max by (node, Hostname, gpu, UUID, modelName) (DCGM_FI_DEV_GPU_TEMP) >= 87",
        "max by (node, Hostname, gpu, UUID, modelName) (rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])) > 0"))
    catalog = load_catalog(data)
    with pytest.raises(InputError) as e:
        check_signals(catalog, load_exporters(), dashboard(catalog))
    text = e.value.render()
    assert "alert GpuOverTemperature" in text and "DCGM_FI_DEV_THERMAL_VIOLATION" in text
    assert "collectors file" in text


def test_the_cli_check_fails_on_such_a_rule(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    data = tmp_path / "data"
    shutil.copytree(ROOT / "gpufleet/catalog/data", data)
    gpu = data / "gpu.yaml"
    gpu.write_text(gpu.read_text().replace("(DCGM_FI_DEV_GPU_TEMP) >= 87", "(DCGM_FI_DEV_MEMORY_TEMP) >= 87"))
    r = CliRunner().invoke(app, ["generate", "--check", "--data-dir", str(data)])
    assert r.exit_code == 2, r.output
    assert "DCGM_FI_DEV_MEMORY_TEMP" in r.output and "GpuOverTemperature" in r.output


def test_the_collectors_file_lists_every_dcgm_field_a_rule_reads() -> None:
    committed = (ROOT / COLLECTORS_FILE).read_text()
    assert committed == collectors_csv(load_exporters())
    fields = collected_fields(committed)
    catalog = load_catalog()
    read = {n for r in readers(rule_groups(catalog), dashboard(catalog)) for n in metric_names(r.expr)}
    dcgm = {n for n in read if n.startswith(("DCGM_FI_", "DCGM_EXP_"))}
    assert dcgm and dcgm <= fields
    # The examples: read by the rules, absent from the stock file the GPU Operator uses.
    series = load_exporters().exporters[DCGM_EXPORTER].series
    stock_off = {n for n, s in series.items() if s.stock_default is False}
    assert {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"} <= stock_off & dcgm


def test_sources_follow_recording_rules_to_exporters() -> None:
    catalog = load_catalog()
    records = {r.record: r.expr for f in catalog for r in f.records}
    rows = series_sources("gpufleet:node_gpus:count < 8", load_exporters(), records)
    assert [(n, e) for n, e, _ in rows] == [
        ("DCGM_FI_DEV_GPU_TEMP", DCGM_EXPORTER),
        ("gpu_junction_temperature", "amd-device-metrics-exporter"),
        ("gpufleet:node_gpus:count", "Prometheus (recording rule of this catalog)"),
        ("npu_chip_info_temperature", "npu-exporter"),
    ]
    assert recorded_names(catalog) >= {"gpufleet:node_gpus:count", "gpufleet:gpu_xid79:latched"}


H200 = RuleSettings(runbook_base="https://runbooks.example.internal/gpufleet", scrape_interval_s=30,
                    fabric_devices=tuple(f"mlx5_{i}" for i in range(8)), fabric_netdevs=None,
                    link_speed_gbps=400)


def test_rules_rendered_for_a_stack_read_its_fabric_and_debounce_on_its_scrapes() -> None:
    groups = rule_groups(load_catalog(), H200)
    rules = {r.get("alert") or r["record"]: r for g in groups for r in g["rules"]}
    port = rules["FabricPortDown"]
    assert 'device=~"mlx5_0|mlx5_1|mlx5_2|mlx5_3|mlx5_4|mlx5_5|mlx5_6|mlx5_7"' in port["expr"]
    assert port["for"] == "1m"  # 2 scrapes of 30 s, above the catalog's 10s
    nic = rules["FabricNicMissing"]["expr"]
    assert nic.startswith('count by (node) (node_infiniband_state_id{device=~"mlx5_0|')
    assert "< 8\n" in nic
    assert "< 5e+10" in rules["FabricLinkDegraded"]["expr"]  # 400 Gb/s in bytes per second
    assert "node_network_" not in rules["FabricLinkDegraded"]["expr"]  # no netdevs declared
    assert rules["GpuFallenOffBus"]["for"] == "0s"  # an XID is the event: no debounce
    assert rules["GpuFallenOffBus"]["annotations"]["runbook_url"] == (
        "https://runbooks.example.internal/gpufleet/GpuFallenOffBus.md")
    with pytest.raises(ValueError, match="fabric_devices"):
        RuleSettings(fabric_devices=())


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")
def test_promtool_accepts_the_rules_rendered_for_a_stack(tmp_path: Path) -> None:
    path = tmp_path / "h200.rules.yaml"
    path.write_text(yaml.safe_dump(rules_document(load_catalog(), H200), sort_keys=False))
    r = subprocess.run([PROMTOOL or "promtool", "check", "rules", str(path)], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_series_has_one_producer(tmp_path: Path) -> None:
    bad = tmp_path / "exporters.yaml"
    text = (ROOT / "gpufleet/catalog/exporters.yaml").read_text()
    bad.write_text(text.replace(
        "      ceph_osd_up: {type: gauge",
        "      up: {type: gauge, help: again}\n      ceph_osd_up: {type: gauge"))
    with pytest.raises(InputError) as e:
        load_exporters(bad)
    assert "up is declared by both prometheus and ceph-mgr" in e.value.render()
