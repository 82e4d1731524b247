"""Generated outputs: promtool accepts and passes them, they are committed and drift-free, and
catalog <-> rules <-> tests <-> runbooks are consistent in both directions."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.catalog.dashboard import DASHBOARD_FILE, dashboard
from gpufleet.catalog.generate import default_root, drift, outputs, write
from gpufleet.catalog.promtests import load_fixtures, missing_fixtures, render
from gpufleet.catalog.rules import RULES_FILE, RUNBOOK_BASE, alert_owners, rule_groups
from gpufleet.catalog.runbooks import SECTIONS, load_notes, missing_notes
from gpufleet.chaos.backends.registry import capabilities

ROOT = default_root()
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def expected(catalog: Catalog) -> dict[str, str]:
    return outputs(catalog, load_fixtures(), load_notes(), capabilities())


def test_committed_files_are_up_to_date(expected: dict[str, str]) -> None:
    assert drift(ROOT, expected) == [], "run `gpufleet generate` and commit the result"


def test_generation_is_deterministic(catalog: Catalog, expected: dict[str, str]) -> None:
    assert outputs(load_catalog(), load_fixtures(), load_notes(), capabilities()) == expected


def test_drift_check_names_changed_missing_and_stale_files(tmp_path: Path, expected: dict[str, str]) -> None:
    assert {d.path for d in drift(tmp_path, expected)} == set(expected)  # all missing
    write(tmp_path, expected)
    assert drift(tmp_path, expected) == []
    (tmp_path / RULES_FILE).write_text("groups: []\n")
    (tmp_path / "runbooks/GpuFallenOffBus.md").unlink()
    (tmp_path / "runbooks/OldAlert.md").write_text("# gone\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    found = {(d.path, d.reason) for d in drift(tmp_path, expected)}
    assert found == {(RULES_FILE, "differs"), ("runbooks/GpuFallenOffBus.md", "missing"),
                     ("runbooks/OldAlert.md", "stale")}
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # wrote nothing
    write(tmp_path, expected)
    assert drift(tmp_path, expected) == []
    assert not (tmp_path / "runbooks/OldAlert.md").exists()


@needs_promtool
def test_promtool_check_rules() -> None:
    r = subprocess.run([PROMTOOL or "promtool", "check", "rules", RULES_FILE], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


@needs_promtool
@pytest.mark.parametrize("test_file", sorted(p.name for p in (ROOT / "monitoring/tests").glob("*.test.yaml")))
def test_promtool_test_rules(test_file: str) -> None:
    r = subprocess.run([PROMTOOL or "promtool", "test", "rules", test_file], cwd=ROOT / "monitoring/tests",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_catches_a_broken_rule(tmp_path: Path, expected: dict[str, str]) -> None:
    """The generated tests are real: raising a threshold makes them fail."""
    write(tmp_path, expected)
    rules = tmp_path / RULES_FILE
    rules.write_text(rules.read_text().replace(">= 87", ">= 99"))
    tests = tmp_path / "monitoring/tests/gpu.test.yaml"
    doc = yaml.safe_load(tests.read_text())
    doc["tests"] = [t for t in doc["tests"] if t["name"].startswith("GpuOverTemperature:")]
    assert len(doc["tests"]) == 2
    tests.write_text(yaml.safe_dump(doc))
    r = subprocess.run([PROMTOOL or "promtool", "test", "rules", "gpu.test.yaml"],
                       cwd=tmp_path / "monitoring/tests", capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "GpuOverTemperature" in r.stdout + r.stderr


def test_every_alert_has_all_promtool_cases(catalog: Catalog, expected: dict[str, str]) -> None:
    cases: dict[str, list[dict[str, object]]] = {}
    for path, text in expected.items():
        if path.startswith("monitoring/tests/"):
            for t in yaml.safe_load(text)["tests"]:
                for check in t["alert_rule_test"]:
                    cases.setdefault(str(check["alertname"]), []).append({"test": t["name"], **check})
    for name, fault in catalog.by_alert().items():
        checks = cases.get(name, [])
        firing = [c for c in checks if c["exp_alerts"]]
        silent = [c for c in checks if not c["exp_alerts"]]
        assert firing, f"{name}: no case where it fires"
        assert any("negative" in str(c["test"]) for c in silent), f"{name}: no negative case"
        assert any("negative" not in str(c["test"]) for c in silent), f"{name}: no silent-before case"
        for c in firing:
            (alert,) = c["exp_alerts"]  # type: ignore[misc]
            assert alert["exp_labels"]["fault"] == fault.id
            assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert "{{" not in alert["exp_annotations"]["description"]


def test_rule_conventions(catalog: Catalog) -> None:
    groups = rule_groups(catalog)
    assert [g["name"] for g in groups] == ["gpufleet-gpu", "gpufleet-node", "gpufleet-fabric",
                                           "gpufleet-storage", "gpufleet-workload"]
    rules = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(rules) == len(catalog.by_alert())
    records = [r for g in groups for r in g["rules"] if "record" in r]
    owners = {o.record for o in alert_owners(catalog).values()}  # ADR 0048, one per exporter
    assert len(owners) == 3
    assert sorted(r["record"] for r in records if r["record"] in owners) == sorted(owners)  # once each
    assert {r["record"] for r in records} == {x.record for f in catalog for x in f.records} | owners
    for r in rules:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", r["alert"])
        assert r["labels"]["severity"] in {"critical", "warning", "info"}
        assert r["labels"]["fault"] == catalog.by_alert()[r["alert"]].id
        assert r["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}/{r['alert']}.md"
        assert "{{" not in r["annotations"]["summary"]
        assert "{{" in r["annotations"]["description"]


def test_consistency_fault_to_alert_and_runbook(catalog: Catalog, expected: dict[str, str]) -> None:
    for f in catalog:
        if f.alert is None:
            assert f.exemption and len(f.exemption) > 40, f"{f.id}: exemption must give a reason"
            continue
        assert f"runbooks/{f.alert.name}.md" in expected, f"{f.id}: no runbook"
        assert (ROOT / "runbooks" / f"{f.alert.name}.md").is_file(), f"{f.id}: runbook not committed"


def test_consistency_files_back_to_faults(catalog: Catalog) -> None:
    alerts = catalog.by_alert()
    for p in (ROOT / "runbooks").glob("*.md"):
        if p.name != "README.md":
            assert p.stem in alerts, f"{p}: runbook of no alert in the catalog"
    doc = yaml.safe_load((ROOT / RULES_FILE).read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            if "record" in r:
                continue
            assert r["alert"] in alerts, f"rule {r['alert']} maps to no fault"
            assert alerts[r["alert"]].id == r["labels"]["fault"]
    assert missing_fixtures(catalog, load_fixtures()) == ([], [])
    assert missing_notes(catalog, load_notes()) == ([], [])


def test_every_runbook_has_the_four_sections_and_real_commands(expected: dict[str, str]) -> None:
    tools = re.compile(r"\b(nvidia-smi|dcgmi|ibstat|ibstatus|perfquery|scontrol|kubectl|ceph|juicefs"
                       r"|sacct|squeue|ipmitool|smartctl)\b")
    for path, text in expected.items():
        if path.startswith("runbooks/") and not path.endswith("README.md"):
            heads = [line for line in text.splitlines() if line.startswith("## ")]
            assert heads == list(SECTIONS), f"{path}: sections {heads}"
            diagnosis = text.split("## Diagnosis")[1].split("## Mitigation")[0]
            assert tools.search(diagnosis), f"{path}: no real command in Diagnosis"


def test_runbooks_say_to_restart_nvidias_device_plugin_after_an_xid_it_does_not_skip(
    catalog: Catalog, expected: dict[str, str]
) -> None:
    """NVIDIA's device plugin keeps a GPU Unhealthy after any XID but its skipped ones, until it
    restarts: the runbook of such a fault says so unless the node reboots (which restarts it); a
    reset's step comes before the node returns."""
    def mitigation(fault_id: str) -> list[str]:
        alert = catalog.get(fault_id).alert
        assert alert is not None, fault_id
        text = expected[f"runbooks/{alert.name}.md"].split("## Mitigation")[1]
        return [line for line in text.splitlines() if re.match(r"\d+\. ", line)]

    def plugin_step(steps: list[str]) -> int | None:
        return next((i for i, s in enumerate(steps) if "nvidia-device-plugin" in s), None)

    reset = mitigation("gpu-xid-48")  # reset-gpu
    i = plugin_step(reset)
    assert i is not None and "After the reset" in reset[i] and "uncordon" in reset[i + 1], reset
    for fault_id in ("gpu-xid-94", "gpu-xid-63"):  # restart-job, none: the node stays in service
        steps = mitigation(fault_id)
        j = plugin_step(steps)
        assert j is not None and "though the node stays in service" in steps[j], (fault_id, steps)
    for fault_id in ("gpu-xid-13", "gpu-xid-43", "gpu-xid-45",  # skipped by the plugin
                     "gpu-xid-79",  # the node reboots, and the plugin with it
                     "gpu-thermal", "amd-gpu-unhealthy"):  # no XID
        assert plugin_step(mitigation(fault_id)) is None, fault_id


def test_runbook_index_lists_every_alert_and_exemption(catalog: Catalog, expected: dict[str, str]) -> None:
    index = expected["runbooks/README.md"]
    for f in catalog:
        if f.alert:
            assert f"[{f.alert.name}]({f.alert.name}.md)" in index
        else:
            assert f"`{f.id}`" in index


def test_dashboard_is_valid_json_with_unique_panel_ids(catalog: Catalog, expected: dict[str, str]) -> None:
    board = json.loads(expected[DASHBOARD_FILE])
    assert board == json.loads(json.dumps(dashboard(catalog)))
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in board["panels"] if p["type"] == "row"}
    assert {"GPU health", "Fabric", "Recovery"} <= titles
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for f in catalog:
        if f.alert:
            assert f.id in exprs, f"{f.id}: not in the dashboard's alert panels"


def test_render_matches_go_template_subset() -> None:
    assert render("GPU {{ $labels.gpu }} on {{ $labels.Hostname }}", {"gpu": "3", "Hostname": "n1"}, None) \
        == "GPU 3 on n1"
    assert render("{{ $labels.missing }}x", {}, None) == "x"
    assert render("{{ $value | humanizePercentage }}", {}, "60%") == "60%"
    with pytest.raises(ValueError, match="give the fixture a value"):
        render("{{ $value }}", {}, None)
    with pytest.raises(ValueError, match="not supported"):
        render("{{ range . }}", {}, None)
