"""Scenario files, game-day reports and the `gpufleet simulate` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sim_testdata import fault, llama3_catalog, stack
from typer.testing import CliRunner

from gpufleet.catalog import Catalog
from gpufleet.cli.main import app
from gpufleet.core.errors import InputError
from gpufleet.core.taxonomy import FaultClass
from gpufleet.sim import load_report, load_scenario, parse_report, resolve

REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_bad_scenario_names_the_file_and_every_path(tmp_path: Path) -> None:
    f = _write(tmp_path, "bad.yaml", yaml.safe_dump({
        "dayz": 3,
        "rates": {"gpu-fatl": {"perMillionGpuHours": 1}, "node-crash": {"perMillionGpuHours": -1}},
        "lemons": {"fraction": 1.5},
        "repair": {"replace": [{"share": 0.5, "minHours": 1, "maxHours": 2}]},
    }))
    with pytest.raises(InputError) as ei:
        load_scenario(f)
    e = ei.value
    assert e.file == str(f)
    paths = {p.path for p in e.problems}
    assert "dayz" in paths
    assert any(p.startswith("rates.gpu-fatl") for p in paths)
    assert "rates.node-crash.perMillionGpuHours" in paths
    assert "lemons.fraction" in paths
    assert "repair" in paths  # shares do not sum to 1
    assert next(p for p in e.problems if p.path == "dayz").message == "unknown key"


def test_scenario_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as ei:
        load_scenario(_write(tmp_path, "s.yaml", "rates: [\n"))
    assert ei.value.problems[0].path.startswith("line ")


def test_example_scenarios_are_valid() -> None:
    files = sorted((REPO / "scenarios").glob("*.yaml"))
    assert files, "scenarios/*.yaml examples are missing"
    for f in files:
        sc = load_scenario(f)
        assert sc.description, f"{f.name}: say what the scenario is for"


def test_scenario_overrides_class_rate_and_keeps_the_split(tmp_path: Path) -> None:
    cat = Catalog((fault("a", "gpu-fatal", "reset-gpu", 3.0, "A"),
                   fault("b", "gpu-fatal", "replace", 1.0, "B"),
                   fault("c", "node-crash", "replace", 2.0, "C")))
    sc = load_scenario(_write(tmp_path, "s.yaml", yaml.safe_dump({
        "description": "t", "rates": {"gpu-fatal": {"perMillionGpuHours": 8.0},
                                      "storage-outage": {"perThousandNodeDays": 1.0}},
        "checkpoint": {"intervalMinutes": 5, "writeSeconds": 0}, "spares": {"count": 0}})))
    p = resolve(stack(), cat, sc)
    per_m = {k.fault_id: k.per_node_hour / 8 * 1e6 for k in p.kinds}
    assert per_m["a"] == pytest.approx(6.0) and per_m["b"] == pytest.approx(2.0)
    assert per_m["c"] == pytest.approx(2.0)
    assert per_m["scenario-storage-outage"] == pytest.approx(1.0 / 1000 / 24 / 8 * 1e6)
    assert p.checkpoint_interval_seconds == 300 and p.checkpoint_write_seconds == 0  # a 0 stays 0
    assert p.spares == 0


REPORT = {
    "schema": "gpufleet.gameday/v1",
    "experiments": [
        {"name": "xid79-a", "fault_class": "gpu-fatal",
         "measured": {"detect_seconds": 12, "isolate_seconds": 40, "recover_seconds": 200}},
        {"name": "xid79-b", "fault_class": "gpu-fatal", "verdict": "PASS",
         "measured": {"detect_seconds": 20, "isolate_seconds": 60, "recover_seconds": 260}},
        {"name": "crash", "fault_class": "node-crash", "measured": {"detect_seconds": 5,
                                                                    "isolate_seconds": None}},
        {"name": "aborted", "fault_class": "fabric-flap", "measured": {}},
        # As gpufleet.gameday writes an experiment that never ran: class unknown, all null.
        {"name": "inject-fails", "fault_class": None, "budget": {"detect_seconds": 60, "recover_seconds": 90},
         "measured": {"detect_seconds": None, "isolate_seconds": None, "recover_seconds": None}},
    ],
}


def test_report_gives_medians_per_class(tmp_path: Path) -> None:
    m = load_report(_write(tmp_path, "r.json", json.dumps(REPORT)))
    g = m[FaultClass.GPU_FATAL]
    assert (g.detect_seconds, g.isolate_seconds, g.recover_seconds) == (16.0, 50.0, 230.0)
    assert m[FaultClass.NODE_CRASH].isolate_seconds is None
    assert FaultClass.FABRIC_FLAP not in m
    p = resolve(stack(), llama3_catalog(), measured=m, report_file="r.json")
    h = p.handling[FaultClass.GPU_FATAL]
    assert (h.detect_seconds, h.isolate_seconds, h.restart_floor_seconds) == (16.0, 34.0, 180.0)
    assert "r.json" in h.detect_source
    assert p.handling[FaultClass.NODE_CRASH].detect_seconds == 5.0


def _exp(**fields: object) -> dict[str, object]:
    return {"name": "e", **fields}


@pytest.mark.parametrize(("doc", "path", "words"), [
    ({"runs": []}, "experiments", "Field required"),
    ({"experiments": [], "runs": []}, "runs", "Extra inputs"),
    ([], "(top level)", "valid dictionary"),
    ({"experiments": [_exp(fault_class="gpu-fatl", measured={"detect_seconds": 1})]},
     "experiments[0].fault_class", "unknown fault class"),
    ({"experiments": [_exp(measured={"detect_seconds": 1})]}, "experiments[0].fault_class", "Field required"),
    ({"experiments": [_exp(fault_class="gpu-fatal", measured={"detect_seconds": -3})]},
     "experiments[0].measured.detect_seconds", "greater than or equal to 0"),
    ({"experiments": [_exp(fault_class="gpu-fatal", measured={"detect_seconds": "fast"})]},
     "experiments[0].measured.detect_seconds", "number"),
    ({"experiments": [_exp(fault_class="gpu-fatal", detectSeconds=4)]},
     "experiments[0].detectSeconds", "Extra inputs"),
    ({"experiments": [_exp(fault_class="gpu-fatal", measured={"detect_seconds": 9, "isolate_seconds": 3})]},
     "experiments[0].measured", "before"),
    ({"experiments": [_exp(fault_class="gpu-fatal")]}, "experiments", "no experiment"),
])
def test_bad_reports_say_where(doc: object, path: str, words: str) -> None:
    with pytest.raises(InputError) as ei:
        parse_report(doc, "rep.json")
    assert ei.value.file == "rep.json"
    assert any(p.path == path and words in p.message for p in ei.value.problems), ei.value.problems


def test_report_that_is_not_json(tmp_path: Path) -> None:
    with pytest.raises(InputError) as ei:
        load_report(_write(tmp_path, "r.json", "{nope"))
    assert ei.value.problems[0].message.startswith("invalid JSON")


def _stack_file(tmp_path: Path) -> Path:
    spec = stack(nodes=32, spares=2)
    data = {"config": {f"gpufleet:{k}": v for k, v in
                       spec.model_dump(mode="json", by_alias=True, exclude_none=True).items()}}
    return _write(tmp_path, "Pulumi.t.yaml", yaml.safe_dump(data))


def test_cli_bad_scenario_exits_2_with_file_and_path(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.yaml", "lemons: {fraction: 2}\n")
    res = CliRunner().invoke(app, ["simulate", "--stack", str(_stack_file(tmp_path)), "--scenario",
                                   str(bad), "--runs", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert str(bad) in res.output and "lemons.fraction" in res.output


def test_cli_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["simulate", "--stack", str(_stack_file(tmp_path)), "--days", "10",
                                   "--runs", "3", "--seed", "42", "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "ETTR" in res.output
    doc = json.loads((out / "simulate.json").read_text())
    assert doc["seed"] == 42 and doc["runs"] == 3
    assert doc["config"]["job_nodes"] == 32 and doc["config"]["days"] == 10
    assert 0 < doc["metrics"]["ettr"]["mean"] <= 1
    for png in ("ettr_vs_checkpoint_interval.png", "ettr_vs_spares.png", "lost_by_cause.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_cli_recommend(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["simulate", "--stack", str(_stack_file(tmp_path)), "--days", "10",
                                   "--runs", "3", "--workers", "1", "--recommend", "--no-plots",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "simulate.json").read_text())["recommendation"]
    assert rec["candidates"]
    best = rec["best"]
    if best is not None:
        assert best["meets_slos"]
        cheaper = [c for c in rec["candidates"] if c["meets_slos"]
                   and c["gpu_hours_per_useful_gpu_hour"] < best["gpu_hours_per_useful_gpu_hour"]]
        assert not cheaper


def test_a_scenario_action_changes_every_fault_of_its_class() -> None:
    from gpufleet.core.taxonomy import LadderAction
    from gpufleet.sim import parse_scenario

    cat = Catalog((fault("a", "gpu-fatal", "reset-gpu", 3.0, "A"),
                   fault("b", "gpu-fatal", "replace", 1.0, "B"),
                   fault("c", "node-crash", "replace", 2.0, "C")))
    sc = parse_scenario({"rates": {"gpu-fatal": {"action": "reboot-node"}}}, "s.yaml")
    p = resolve(stack(), cat, sc)
    actions = {k.fault_id: k.action for k in p.kinds}
    assert actions == {"a": LadderAction.REBOOT_NODE, "b": LadderAction.REBOOT_NODE,
                       "c": LadderAction.REPLACE}
    per_m = {k.fault_id: k.per_node_hour / 8 * 1e6 for k in p.kinds}
    assert per_m["a"] == pytest.approx(3.0)  # an action alone keeps the rate


def test_scenario_keys_that_would_change_nothing_are_refused_with_their_paths() -> None:
    from gpufleet.sim import parse_scenario

    cat = Catalog((fault("a", "gpu-fatal", "reset-gpu", 3.0, "A"),
                   fault("st", "storage-outage", "none", 1.0, "S")))
    sc = parse_scenario({
        "rates": {"node-hang": {"action": "replace"}},          # no rate for node-hang
        "weibullShape": {"storage-outage": 0.7},                # store faults are fleet-level
        "domainOutageHours": {"gpu-fatal": 2},                  # gpu-fatal hits single nodes
        "isolateSeconds": {"storage-outage": 5},                # a store fault isolates nothing
        "detection": {"activeSeconds": {"gpu-fatal": 3}},       # gpu-fatal is passive here
        "lemons": {"multiplier": 5},                            # fraction 0
        "spares": {"coldStartSeconds": 600},                    # spares are warm
        "storage": {"degradedFactor": 3},                       # no storage-degraded rate
        "domains": {"storage-outage": "leaf"},                  # the store is job-wide
    }, "s.yaml")
    with pytest.raises(InputError) as ei:
        resolve(stack(), cat, sc, scenario_file="s.yaml")
    assert ei.value.file == "s.yaml"
    assert {p.path for p in ei.value.problems} == {
        "rates.node-hang.action", "weibullShape.storage-outage", "domainOutageHours.gpu-fatal",
        "isolateSeconds.storage-outage", "detection.activeSeconds.gpu-fatal", "lemons.multiplier",
        "spares.coldStartSeconds", "storage.degradedFactor", "domains.storage-outage"}
    # The same keys where they do change the model are accepted.
    ok = parse_scenario({"detection": {"mode": {"gpu-fatal": "active"}, "activeSeconds": {"gpu-fatal": 3}},
                         "lemons": {"fraction": 0.1, "multiplier": 5},
                         "spares": {"mode": "cold", "coldStartSeconds": 600}}, "ok.yaml")
    p = resolve(stack(), cat, ok)
    assert p.handling[FaultClass.GPU_FATAL].detect_seconds == 3
    assert (p.lemon_fraction, p.cold_start_seconds) == (0.1, 600)


def test_new_scenario_keys_reach_the_parameters() -> None:
    from gpufleet.sim import parse_scenario

    cat = Catalog((fault("a", "gpu-fatal", "reset-gpu", 3.0, "A"),
                   fault("sd", "storage-degraded", "none", 1.0, "S")))
    sc = parse_scenario({
        "checkpoint": {"failureProbability": 0.02, "retries": 1},
        "storage": {"referenceGpus": 4096, "degradedFactor": 3},
        "attemptCaps": {"windowHours": 24}, "upgrade": {"startHours": 2, "waveNodes": 4, "waveMinutes": 30},
    }, "s.yaml")
    p = resolve(stack(), cat, sc)
    assert (p.checkpoint_failure_probability, p.checkpoint_retries) == (0.02, 1)
    assert (p.store_reference_gpus, p.store_degraded_factor) == (4096, 3)
    assert p.attempt_window_seconds == 86400
    assert p.upgrade is not None and (p.upgrade.start_seconds, p.upgrade.wave_nodes,
                                      p.upgrade.wave_seconds) == (7200, 4, 1800)
    assert p.handling[FaultClass.STORAGE_DEGRADED].domain == "cluster"


def test_report_experiments_drive_the_projection_as_a_distribution(tmp_path: Path) -> None:
    m = load_report(_write(tmp_path, "r.json", json.dumps(REPORT)))
    assert m[FaultClass.GPU_FATAL].samples == ((12.0, 40.0, 200.0), (20.0, 60.0, 260.0))
    p = resolve(stack(), llama3_catalog(), measured=m, report_file="r.json")
    # Each experiment: detect, isolate - detect, recover - isolate.
    assert p.handling[FaultClass.GPU_FATAL].measured == ((12.0, 28.0, 160.0), (20.0, 40.0, 200.0))
    assert p.handling[FaultClass.NODE_CRASH].measured == ()  # one experiment: its value is used


def test_the_stacks_xid_overrides_reach_the_simulator() -> None:
    """remediation.xidOverrides move an XID's faults to the stack's class and action."""
    from gpufleet.config.model import XidOverride
    from gpufleet.core.taxonomy import LadderAction

    cat = Catalog((fault("x13", "gpu-contained", "restart-job", 3.0, "A", xid=13),
                   fault("x79", "gpu-fatal", "reset-gpu", 1.0, "B", xid=79)))
    spec = stack()
    spec.remediation.xid_overrides[13] = XidOverride(
        action=LadderAction.RESET_GPU, fault_class=FaultClass.GPU_FATAL, reason="repeats here mean hardware")
    kinds = {k.fault_id: (k.fault_class, k.action) for k in resolve(spec, cat).kinds}
    assert kinds == {"x13": (FaultClass.GPU_FATAL, LadderAction.RESET_GPU),
                     "x79": (FaultClass.GPU_FATAL, LadderAction.RESET_GPU)}
    assert {k.fault_id: k.fault_class for k in resolve(stack(), cat).kinds}["x13"] is FaultClass.GPU_CONTAINED


def test_every_shipped_scenario_changes_the_model_on_every_shipped_stack() -> None:
    """No key of a shipped scenario is refused as changing nothing, on any shipped stack."""
    from gpufleet.catalog import load_catalog
    from gpufleet.config import load_stack

    cat = load_catalog()
    stacks = sorted((REPO / "stacks").glob("Pulumi.*.yaml"))
    assert stacks
    for f in sorted((REPO / "scenarios").glob("*.yaml")):
        sc = load_scenario(f)
        for s in stacks:
            p = resolve(load_stack(s), cat, sc, scenario_file=str(f), pool=None)
            assert p.kinds, (f.name, s.name)


def _refused(data: dict[str, object], cat: Catalog, **kw: object) -> set[str]:
    from gpufleet.sim import parse_scenario

    try:
        resolve(kw.pop("spec", None) or stack(), cat, parse_scenario(data, "s.yaml"),  # type: ignore[arg-type]
                scenario_file="s.yaml", **kw)  # type: ignore[arg-type]
    except InputError as e:
        assert e.file == "s.yaml"
        return {p.path for p in e.problems}
    return set()


def test_more_keys_that_would_change_nothing_are_refused() -> None:
    cat = Catalog((fault("x13", "gpu-contained", "restart-job", 3.0, "A"),     # never isolated
                   fault("sw", "fabric-switch-down", "none", 1.0, "L"),        # a leaf: action unused
                   fault("sd", "storage-degraded", "none", 1.0, "S"),          # job keeps running
                   fault("cr", "node-crash", "replace", 1.0, "C")))            # replace only
    refused = _refused({
        "rates": {"fabric-switch-down": {"action": "reboot-node"},
                  "node-crash": {"action": "replace", "source": "a note without a rate"}},
        "isolateSeconds": {"gpu-contained": 30},
        "detection": {"mode": {"storage-degraded": "active", "node-hang": "active"}},
        "repair": {"resetGpuSeconds": 100, "rebootNodeSeconds": 100},
        "attemptCaps": {"windowHours": 24},
        "upgrade": {"startHours": 48, "waveNodes": 4, "waveMinutes": 30},
    }, cat, days=1)
    assert refused == {
        "rates.fabric-switch-down.action", "rates.node-crash.source", "isolateSeconds.gpu-contained",
        "detection.mode.storage-degraded", "detection.mode.node-hang", "repair.resetGpuSeconds",
        "repair.rebootNodeSeconds", "attemptCaps.windowHours", "upgrade.startHours"}
    assert _refused({"checkpoint": {"retries": 2}}, cat) == {"checkpoint.retries"}  # nothing fails
    assert _refused({"checkpoint": {"retries": 2, "failureProbability": 0.1}}, cat) == set()
    assert _refused({"rates": {"storage-degraded": {"action": "replace"}}}, cat) == {
        "rates.storage-degraded.action"}  # a store fault isolates no node
    # Where they do change the model they are accepted: a class that escalates to a reset is
    # isolated, reset and reboot are reached, the caps count them, the wave starts in time.
    esc = Catalog((fault("x13", "gpu-contained", "restart-job", 3.0, "A",
                         escalation={"repeats": 2, "windowHours": 24, "to": "reset-gpu"}),
                   fault("cr", "node-crash", "replace", 1.0, "C")))
    assert _refused({"isolateSeconds": {"gpu-contained": 30},
                     "repair": {"resetGpuSeconds": 100, "rebootNodeSeconds": 100},
                     "attemptCaps": {"windowHours": 24},
                     "upgrade": {"startHours": 2, "waveNodes": 4, "waveMinutes": 30}}, esc, days=1) == set()


def test_spare_keys_without_spares_and_keys_a_report_overrides_are_refused(tmp_path: Path) -> None:
    cat = Catalog((fault("a", "gpu-fatal", "reset-gpu", 3.0, "A"),))
    assert _refused({"spares": {"mode": "cold", "coldStartSeconds": 60}}, cat,
                    spec=stack(spares=0)) == {"spares.mode", "spares.coldStartSeconds"}
    assert _refused({"spares": {"count": 2, "mode": "cold", "coldStartSeconds": 60}}, cat,
                    spec=stack(spares=0)) == set()
    # The report measured gpu-fatal's detection and isolation in every experiment: the scenario's
    # times for them would be overridden, so they are refused (the report's path named).
    m = load_report(_write(tmp_path, "r.json", json.dumps(REPORT)))
    keys = {"detection": {"mode": {"gpu-fatal": "active"}, "activeSeconds": {"gpu-fatal": 3}},
            "isolateSeconds": {"gpu-fatal": 30}}
    assert _refused(keys, llama3_catalog(), measured=m, report_file="r.json") == {
        "detection.mode.gpu-fatal", "detection.activeSeconds.gpu-fatal", "isolateSeconds.gpu-fatal"}
    # node-crash's isolation was not measured: its scenario time still counts.
    assert _refused({"isolateSeconds": {"node-crash": 30}}, llama3_catalog(), measured=m,
                    report_file="r.json") == set()


def test_monitor_only_isolation_is_manual_even_with_one_measured_experiment(tmp_path: Path) -> None:
    one = {"experiments": [REPORT["experiments"][0]]}
    m = load_report(_write(tmp_path, "r.json", json.dumps(one)))
    base = stack()
    manual = base.remediation.model_copy(update={"mode": "monitor-only"})
    spec = base.model_copy(update={"remediation": manual})
    p = resolve(spec, llama3_catalog(), measured=m, report_file="r.json")
    assert p.handling[FaultClass.GPU_FATAL].isolate_seconds == p.manual_seconds == 3600.0
    assert p.handling[FaultClass.GPU_FATAL].detect_seconds == 12.0  # detection is still measured


def test_a_real_game_day_summary_drives_the_projection() -> None:
    """The measured times of a sandbox game-day (benchmarks/gameday.py, 20 experiments, the fields
    the simulator reads kept as written). Its link flap recovered at 3.2 s, before it was detected
    (7.9 s): accepted, with detection counted up to the recovery, not refused."""
    from gpufleet.sim import run_study

    f = Path(__file__).parent / "data" / "gameday-summary-sandbox.json"
    m = load_report(f)
    flap = m[FaultClass.FABRIC_FLAP]
    assert flap.recovered_first == ("fabric-link-flap",)
    assert [flap.detect_seconds, flap.isolate_seconds, flap.recover_seconds] == pytest.approx([3.1629] * 3,
                                                                                             abs=1e-3)
    p = resolve(stack(nodes=16, spares=2), llama3_catalog(), measured=m, report_file=str(f), days=5)
    h = p.handling[FaultClass.FABRIC_FLAP]
    assert h.restart_floor_seconds == 0.0 and "recovered before detection" in h.detect_source
    # xid48, xid79 (job node and idle node) and the budget breach: each fault draws one of the four
    assert len(p.handling[FaultClass.GPU_FATAL].measured) == 4
    s = run_study(p, seed=1, runs=2, workers=1, sweep_spares=False, do_sensitivity=False)
    rows = {g["fault_class"]: g for g in s.gameday}
    assert {"gpu-fatal", "node-crash", "fabric-flap"} <= rows.keys()
    fatal = rows["gpu-fatal"]
    assert fatal["projected"]["restart_seconds"] >= fatal["measured"]["restart_seconds"]
