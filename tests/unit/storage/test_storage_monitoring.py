"""The storage sandbox's monitoring configuration (gpufleet.sandbox.storage.monitoring), checked by
the real promtool where it is installed, and the path the detection budgets see on its stack."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import load_catalog
from gpufleet.catalog.detection import can_fire
from gpufleet.catalog.exporters import load_exporters
from gpufleet.config.load import load_named_stack
from gpufleet.infra.monitoring import path_settings
from gpufleet.sandbox.prometheus import repo_rule_file
from gpufleet.sandbox.storage import monitoring

ROOT = Path(__file__).resolve().parents[3]
PORTS = {"mgr-prometheus": 41001, "blackbox": 41002, "prometheus": 41003, "rgw": 41004}
CATALOG = load_catalog()
PLAN = monitoring.MonitoringPlan(scrape_s=2.0, evaluation_s=1.0, rule_file=repo_rule_file())


def test_prometheus_scrapes_the_mgr_exporter_and_probes_radosgw_through_the_blackbox_exporter() -> None:
    cfg = monitoring.prometheus_config(PLAN, PORTS, "http://127.0.0.1:41004", "r1")
    assert cfg["global"]["scrape_interval"] == cfg["global"]["scrape_timeout"] == "2s"
    assert cfg["global"]["evaluation_interval"] == "1s"
    assert cfg["rule_files"] == [str(repo_rule_file())]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"ceph", "gpufleet-object-store"}
    assert jobs["ceph"]["static_configs"] == [{"targets": ["127.0.0.1:41001"]}]
    assert jobs["ceph"]["honor_labels"] is True
    probe = jobs["gpufleet-object-store"]
    assert probe["metrics_path"] == "/probe" and probe["params"] == {"module": ["http_2xx"]}
    assert probe["static_configs"] == [{"targets": ["http://127.0.0.1:41004"]}]
    # The target becomes the probe's parameter and the series' instance; the scrape goes to the exporter.
    relabel = probe["relabel_configs"]
    assert relabel[0] == {"source_labels": ["__address__"], "target_label": "__param_target"}
    assert relabel[1] == {"source_labels": ["__param_target"], "target_label": "instance"}
    assert relabel[2] == {"target_label": "__address__", "replacement": "127.0.0.1:41002"}
    # Every address is loopback.
    text = yaml.safe_dump(cfg)
    assert "0.0.0.0" not in text and "localhost" not in text


def test_the_catalog_alerts_read_the_job_names_the_storage_sandbox_scrapes() -> None:
    exprs = {f.alert.name: f.alert.expr for f in CATALOG.faults if f.alert is not None}
    assert f'job="{monitoring.OBJECT_STORE_JOB}"' in exprs["StorageObjectStoreDown"]
    assert "ceph_osd_up" in exprs["StorageCephOsdDown"]
    assert 'name="OSD_NEARFULL"' in exprs["StorageCephOsdNearFull"]
    assert 'name="OSD_FULL"' in exprs["StorageCephOsdFull"]


def test_mgr_module_listens_on_loopback_without_its_cache_at_the_scrape_interval() -> None:
    settings = dict(monitoring.mgr_module_settings(PLAN, PORTS))
    assert settings == {
        "mgr/prometheus/server_addr": "127.0.0.1",
        "mgr/prometheus/server_port": "41001",
        "mgr/prometheus/cache": "false",
        "mgr/prometheus/scrape_interval": "2",
    }


def test_argv_binds_loopback_ports(tmp_path: Path) -> None:
    bb = monitoring.blackbox_argv(tmp_path / "b.yml", PORTS)
    assert bb[0] == "prometheus-blackbox-exporter" and "--web.listen-address=127.0.0.1:41002" in bb
    prom = monitoring.prometheus_argv(tmp_path / "p.yml", tmp_path / "data", PORTS)
    assert prom[0] == "prometheus" and "--web.listen-address=127.0.0.1:41003" in prom


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make apt)")
def test_promtool_accepts_the_generated_prometheus_config(tmp_path: Path) -> None:
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        monitoring.dump(monitoring.prometheus_config(PLAN, PORTS, "http://127.0.0.1:41004", "r1"), "test")
    )
    res = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.skipif(
    shutil.which("prometheus-blackbox-exporter") is None, reason="blackbox exporter not installed (make apt)"
)
def test_the_blackbox_exporter_accepts_its_config(tmp_path: Path) -> None:
    cfg = tmp_path / "blackbox.yml"
    cfg.write_text(monitoring.dump(monitoring.blackbox_config(2.0), "test"))
    res = subprocess.run(
        ["prometheus-blackbox-exporter", f"--config.file={cfg}", "--config.check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_storage_alerts_can_fire_only_on_a_sandbox_stack_with_ceph() -> None:
    exporters = load_exporters()
    with_ceph = path_settings(load_named_stack("sandbox-storage", ROOT / "stacks"))
    without = path_settings(load_named_stack("sandbox", ROOT / "stacks"))
    assert {"ceph-mgr", "blackbox-exporter"} <= set(with_ceph.exporters)
    assert not {"ceph-mgr", "blackbox-exporter"} & set(without.exporters)
    for fault in ("storage-ceph-osd-down", "storage-ceph-osd-near-full", "storage-object-store-outage"):
        assert can_fire(CATALOG.get(fault), CATALOG, exporters, with_ceph), fault
        assert not can_fire(CATALOG.get(fault), CATALOG, exporters, without), fault
