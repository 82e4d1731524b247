"""Worst-case detection paths and the routing check (gpufleet.catalog.detection, ADR 0044): sums
computed by hand from the stack values written in each test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.catalog.detection import (
    ExporterTiming,
    PathSettings,
    budget_alerts,
    budget_problems,
    can_fire,
    detection_path,
    routing_problems,
    used_severities,
)
from gpufleet.catalog.exporters import load_exporters
from gpufleet.catalog.generate import default_root
from gpufleet.catalog.rules import RuleSettings, rule_groups
from gpufleet.cli.main import app
from gpufleet.config import load_stack
from gpufleet.core.taxonomy import FaultClass
from gpufleet.infra.monitoring import alert_routing_problems, alertmanager_config, path_settings

ROOT = default_root()
CATALOG = load_catalog()
EXPORTERS = load_exporters()


def _settings(group_wait: float | None = 30.0,
              vendors: frozenset[str] = frozenset({"nvidia"})) -> PathSettings:
    # A production stack: dcgm-exporter collects every 10 s and is scraped every 10 s, the rest every
    # 30 s; rules every 15 s; minScrapes debounced against the slowest scrape, 30 s.
    timings = {name: ExporterTiming(0.0, "at scrape", 30.0, "scrapeInterval") for name in EXPORTERS.exporters}
    timings["dcgm-exporter"] = ExporterTiming(10.0, "DCGM_EXPORTER_INTERVAL", 10.0, "dcgmScrapeInterval")
    waits = None if group_wait is None else {
        s: (group_wait, "groupWait") for s in ("critical", "warning", "info")}
    return PathSettings(exporters=timings, evaluation_s=15.0, evaluation_source="evaluationInterval",
                        group_wait_s=waits, rules=RuleSettings(scrape_interval_s=30.0), vendors=vendors)


def test_gpu_missing_path_sums_every_term() -> None:
    path = detection_path(CATALOG.get("gpu-missing"), CATALOG, EXPORTERS, _settings())
    # collection 10 + scrape 10 + evaluation 15 + for (minScrapes 2 x 30 s = 60 s, 4 evaluations) 60
    # + group_wait 30 = 125.
    assert [t.seconds for t in path.terms] == [10.0, 10.0, 15.0, 60.0, 30.0]
    assert path.total_s == 125.0
    assert "dcgm-exporter collection 10 s" in path.text() and path.text().endswith("= 125 s")


def test_for_is_rounded_up_to_whole_evaluations_and_the_sandbox_has_no_group_wait() -> None:
    # StorageObjectStoreDown: blackbox probe at scrape 0 + scrape 30 + evaluation 15 + for 2m = 120
    # (8 evaluations) = 165 without Alertmanager.
    st = _settings(group_wait=None)
    path = detection_path(CATALOG.get("storage-object-store-outage"), CATALOG, EXPORTERS, st)
    assert [t.what for t in path.terms][-1] == "for" and path.total_s == 165.0
    # An evaluation interval of 50 s holds `for: 2m` until the third evaluation: 150 s.
    odd = PathSettings(st.exporters, 50.0, "evaluationInterval", None, st.rules, st.vendors)
    path = detection_path(CATALOG.get("storage-object-store-outage"), CATALOG, EXPORTERS, odd)
    assert path.total_s == 0 + 30 + 50 + 150


def test_only_the_stack_vendors_exporters_count() -> None:
    # GpuMissing reads the GPU count built from dcgm-exporter, AMD's and npu-exporter's temperatures:
    # on an AMD stack the AMD exporter's timing counts (scrape 30 here), not dcgm-exporter's.
    amd = _settings(vendors=frozenset({"amd"}))
    path = detection_path(CATALOG.get("gpu-missing"), CATALOG, EXPORTERS, amd)
    assert path.terms[0].what == "amd-device-metrics-exporter collection"
    assert path.total_s == 0 + 30 + 15 + 60 + 30


def test_which_alerts_bind_a_budget() -> None:
    nvidia = frozenset({"nvidia"})
    fatal = {f.alert.name for f in budget_alerts(CATALOG, FaultClass.GPU_FATAL, nvidia) if f.alert}
    assert fatal == {"GpuMissing"}  # the XID alerts have a health check that detects them too
    assert budget_alerts(CATALOG, FaultClass.NODE_CRASH, nvidia) == []  # the scheduler notices first
    assert budget_alerts(CATALOG, FaultClass.FABRIC_SWITCH_DOWN, nvidia) == []  # its ports first
    storage = {f.alert.name for f in budget_alerts(CATALOG, FaultClass.STORAGE_OUTAGE, nvidia) if f.alert}
    # The critical ones only.
    assert storage == {"StorageObjectStoreDown", "StorageMetadataEngineDown", "StorageCephOsdFull"}


def test_a_budget_shorter_than_the_path_is_a_problem_naming_the_terms() -> None:
    problems = budget_problems(CATALOG, EXPORTERS, {FaultClass.GPU_FATAL: 120.0}, _settings())
    assert len(problems) == 1
    assert problems[0].path == "slos.budgets.gpu-fatal.detectSeconds"
    assert "120 s is less than the worst-case detection of GpuMissing" in problems[0].message
    assert "Alertmanager group_wait 30 s" in problems[0].message and "= 125 s" in problems[0].message
    assert budget_problems(CATALOG, EXPORTERS, {FaultClass.GPU_FATAL: 125.0}, _settings()) == []


def test_the_shipped_sandbox_meets_its_gpu_fatal_budget_at_the_first_firing_sample() -> None:
    st = path_settings(load_stack(ROOT / "stacks/Pulumi.sandbox.yaml"))
    assert st.group_wait_s is None
    # scrape 2 + evaluation 1 + for (minScrapes 2 x 2 s = 4 s) = 7 s, within its 15 s.
    assert detection_path(CATALOG.get("gpu-missing"), CATALOG, EXPORTERS, st).total_s == 7.0


def test_h200_takes_group_wait_from_the_stack_and_dcgm_timing_from_its_interval() -> None:
    st = path_settings(load_stack(ROOT / "stacks/Pulumi.h200-ib.yaml"))
    assert st.group_wait_s is not None and st.group_wait_s["critical"] == (30.0, "monitoring.groupWait")
    assert st.exporters["dcgm-exporter"].collect_s == 10.0 and st.exporters["dcgm-exporter"].scrape_s == 10.0
    assert st.exporters["node-exporter"].scrape_s == 30.0
    # Pinned from the exporters' sources (exporters.yaml): AMD's 30 s health refresh, npu-exporter's
    # 5 s cache; none of the shipped exporters is left `unknown` any more.
    assert st.exporters["amd-device-metrics-exporter"].collect_s == 30.0
    assert st.exporters["npu-exporter"].collect_s == 5.0
    assert all(t.collect_s is not None for t in st.exporters.values())


def test_routing_refuses_an_unrouted_or_blackholed_severity_unless_declared() -> None:
    used = {"critical": ["GpuMissing"], "warning": ["GpuOverTemperature"], "info": ["GpuXid45Storm"]}
    problems = routing_problems(used, [("critical", "pager"), ("warning", "null")], [])
    msgs = {p.message.split(" ")[1]: p.message for p in problems}
    assert set(msgs) == {"warning", "info"}
    assert "routed to 'null', which delivers nowhere" in msgs["warning"]
    assert "GpuOverTemperature" in msgs["warning"]
    assert "has no route" in msgs["info"] and "GpuXid45Storm" in msgs["info"]
    assert routing_problems(used, [("critical", "pager"), ("warning", "slack")], ["info"]) == []
    # The first matching route wins, as in Alertmanager: a later real receiver does not help.
    shadowed = [("critical", "blackhole"), ("critical", "pager")]
    assert len(routing_problems(used, shadowed, ["warning", "info"])) == 1
    contradiction = routing_problems(used, [("critical", "pager"), ("warning", "slack")], ["info", "warning"])
    assert [p.path for p in contradiction] == ["monitoring.notPagedSeverities"]


def test_the_rules_use_three_severities_and_every_shipped_stack_routes_or_declares_them() -> None:
    assert set(used_severities(rule_groups(CATALOG))) == {"critical", "warning", "info"}
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        assert alert_routing_problems(load_stack(path)) == [], path.name


def test_alertmanager_config_carries_the_group_wait_the_budget_counts() -> None:
    spec = load_stack(ROOT / "stacks/Pulumi.h200-ib.yaml")
    route = alertmanager_config(spec.monitoring)["route"]
    assert route["group_wait"] == "30s"
    assert all("group_wait" not in r for r in route["routes"])  # no route overrides it in this stack


@pytest.fixture
def unrouted_stack(tmp_path: Path) -> Path:
    text = (ROOT / "stacks/Pulumi.sandbox.yaml").read_text()
    text = text.replace("    notPagedSeverities: [critical, warning, info]\n", textwrap.indent(
        "alertRoutes:\n  - {severity: critical, receiver: pager}\nnotPagedSeverities: [info]\n", "    "))
    path = tmp_path / "Pulumi.sandbox.yaml"
    path.write_text(text)
    return path


def test_validate_refuses_a_stack_leaving_warning_unrouted(unrouted_stack: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(unrouted_stack), "--experiments-dir",
                                      str(ROOT / "experiments")])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert str(unrouted_stack.name) in out and "monitoring.alertRoutes" in out
    assert "severity warning has no route" in out and "Traceback" not in out


# ----------------------------------------------------------------------------- refused budgets (ADR 0046)


def test_an_alert_whose_exporter_the_sandbox_does_not_run_binds_nothing_there() -> None:
    st = path_settings(load_stack(ROOT / "stacks/Pulumi.sandbox.yaml"))
    # No blackbox probe runs in the sandbox: StorageObjectStoreDown cannot fire, so it times nothing.
    assert "blackbox-exporter" not in st.exporters and "dcgm-exporter" in st.exporters
    assert not can_fire(CATALOG.get("storage-object-store-outage"), CATALOG, EXPORTERS, st)
    assert can_fire(CATALOG.get("gpu-missing"), CATALOG, EXPORTERS, st)
    assert budget_problems(CATALOG, EXPORTERS, {FaultClass.STORAGE_OUTAGE: 1.0}, st) == []
    # On a cluster the operator's probe is assumed deployed (exporters.yaml `setting`): it binds.
    assert can_fire(CATALOG.get("storage-object-store-outage"), CATALOG, EXPORTERS, _settings())


def test_a_fault_budget_replaces_its_class_budget_for_that_alert_only() -> None:
    budgets = {FaultClass.GPU_FATAL: 60.0}
    (problem,) = budget_problems(CATALOG, EXPORTERS, budgets, _settings(), {"gpu-missing": 120.0})
    assert problem.path == "slos.faultBudgets.gpu-missing.detectSeconds"
    assert "120 s is less than the worst-case detection of GpuMissing" in problem.message
    assert budget_problems(CATALOG, EXPORTERS, budgets, _settings(), {"gpu-missing": 125.0}) == []


def test_a_fault_budget_that_times_nothing_is_refused() -> None:
    budgets = {FaultClass.GPU_FATAL: 60.0}
    problems = budget_problems(CATALOG, EXPORTERS, budgets, _settings(),
                               {"gpu-missing": 125.0, "gpu-xid-79": 90.0, "no-such-fault": 5.0})
    by_path = {p.path: p.message for p in problems}
    assert set(by_path) == {"slos.faultBudgets.gpu-xid-79", "slos.faultBudgets.no-such-fault"}
    assert "the node health check detects it first" in by_path["slos.faultBudgets.gpu-xid-79"]
    assert "not a fault of the catalog" in by_path["slos.faultBudgets.no-such-fault"]


def _stack_with(tmp_path: Path, slos_extra: str) -> Path:
    """The h200 stack with its faultBudgets block replaced by `slos_extra`."""
    text = (ROOT / "stacks/Pulumi.h200-ib.yaml").read_text()
    start = text.index("    faultBudgets:")
    end = text.index("  gpufleet:gameday:")
    text = text[:start] + textwrap.indent(slos_extra, "    ") + text[end:]
    path = tmp_path / "Pulumi.h200-ib.yaml"
    path.write_text(text)
    return path


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", str(path), "--experiments-dir", str(ROOT / "experiments")])
    return result.exit_code, " ".join(result.output.split())


def test_validate_refuses_budgets_the_monitoring_cannot_meet(tmp_path: Path) -> None:
    code, out = _validate(_stack_with(tmp_path, "faultBudgets: {}\n"))
    assert code == 2 and "Traceback" not in out
    assert ("slos.budgets.gpu-fatal.detectSeconds: 60 s is less than the worst-case detection of "
            "GpuMissing") in out
    assert "Alertmanager group_wait 30 s (monitoring.groupWait) = 125 s" in out
    assert "slos.budgets.storage-outage.detectSeconds: 120 s" in out and "StorageObjectStoreDown" in out


def test_validate_refuses_a_fault_budget_that_breaks_its_class_order(tmp_path: Path) -> None:
    # GpuMissing's 125 s detection after gpu-fatal's 120 s isolation: detect <= isolate broken.
    extra = ("faultBudgets:\n  gpu-missing: {detectSeconds: 125}\n"
             "  storage-object-store-outage: {detectSeconds: 195}\n"
             "  storage-metadata-loss: {detectSeconds: 135}\n")
    code, out = _validate(_stack_with(tmp_path, extra))
    assert code == 2
    assert "slos.faultBudgets.gpu-missing: merged into slos.budgets.gpu-fatal" in out
    assert "detectSeconds <= isolateSeconds <= recoverSeconds" in out


def test_every_shipped_stack_meets_its_detection_budgets() -> None:
    from gpufleet.infra.monitoring import detection_budget_problems

    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        assert detection_budget_problems(load_stack(path)) == [], path.name


def test_a_health_check_counts_where_the_stacks_node_check_reads_it() -> None:
    amd = frozenset({"amd"})
    # gpufleet node-health (Slurm, sandbox) reads the AMD exporter's series: it detects first.
    assert CATALOG.get("amd-gpu-unhealthy") not in budget_alerts(CATALOG, FaultClass.GPU_FATAL, amd)
    # node-problem-detector's script reads XIDs and fabric ports only: the alert is the detector.
    npd = frozenset({"xid", "link"})
    fatal = {f.id for f in budget_alerts(CATALOG, FaultClass.GPU_FATAL, amd, npd)}
    assert {"amd-gpu-unhealthy", "amd-gpu-ecc-uncorrectable"} <= fatal
    k8s = path_settings(load_stack(ROOT / "stacks" / "Pulumi.mi300x-roce.yaml"))
    sandbox = path_settings(load_stack(ROOT / "stacks" / "Pulumi.sandbox-mi300x.yaml"))
    assert k8s.health_sources == npd and "exporter-field" in sandbox.health_sources


def test_exporter_series_of_a_fault_must_be_its_vendors() -> None:
    from gpufleet.catalog.exporters import vendor_series_problems

    assert vendor_series_problems(CATALOG, EXPORTERS) == []
    wrong = CATALOG.get("ascend-npu-unhealthy").model_copy(update={"vendor": "amd"})
    problems = vendor_series_problems([wrong], EXPORTERS)
    assert [p.path for p in problems] == ["ascend-npu-unhealthy.injection.metric",
                                          "ascend-npu-unhealthy.healthCheck.metric"]
    assert "npu_chip_info_health_status is not a series of the amd exporter" in problems[0].message
    nv = CATALOG.get("amd-gpu-unhealthy").model_copy(update={"vendor": None})
    assert "NVIDIA's are DCGM fields" in vendor_series_problems([nv], EXPORTERS)[0].message
