"""Discovery lists every activity with docs; every experiment validates and every activity in it
resolves to a real function whose signature accepts its arguments."""

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from chaoslib.discovery.package import get_discover_function
from chaoslib.experiment import ensure_experiment_is_valid

import gpufleet.chaos
from gpufleet.catalog import load_catalog
from gpufleet.chaos import ACTIVITY_MODULES, discover

EXPERIMENTS = sorted((Path(__file__).parents[3] / "experiments").glob("*.json"))


def test_discover_lists_every_exported_function_with_docs() -> None:
    assert get_discover_function(gpufleet.chaos) is discover
    found = discover(discover_system=False)["activities"]
    by_mod: dict[str, set[str]] = {}
    for a in found:
        by_mod.setdefault(a["mod"], set()).add(a["name"])
        assert (a["doc"] or "").strip(), f"{a['mod']}.{a['name']} has no docstring"
        assert a["type"] == ("action" if a["mod"].endswith(".actions") else "probe")
    for mod in ACTIVITY_MODULES:
        exported = set(importlib.import_module(mod).__all__)
        assert exported, mod
        assert by_mod.get(mod) == exported, mod


def test_every_activity_takes_configuration_and_secrets() -> None:
    for mod in ACTIVITY_MODULES:
        m = importlib.import_module(mod)
        for name in m.__all__:
            params = inspect.signature(getattr(m, name)).parameters
            assert "configuration" in params and "secrets" in params, f"{mod}.{name}"


def _activities(exp: dict[str, Any]) -> list[dict[str, Any]]:
    acts = list(exp.get("method", [])) + list(exp.get("rollbacks", []))
    acts += list((exp.get("steady-state-hypothesis") or {}).get("probes", []))
    return acts


def test_there_are_the_experiments_the_issue_asks_for() -> None:
    names = {p.stem for p in EXPERIMENTS}
    assert {
        "gpu-xid79-fallen-off-bus",
        "gpu-xid48-double-bit-ecc",
        "gpu-xid94-contained-ecc",
        "gpu-xid45-burst-after-crash",
        "node-crash",
        "node-hang",
        "fabric-link-down",
        "fabric-link-flap",
        "fabric-degraded",
        "storage-checkpoint-outage",
        "two-nodes-spare-exhausted",
        "recovery-budget-breach",
    } <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_is_valid_and_resolves(path: Path) -> None:
    exp = json.loads(path.read_text())
    ensure_experiment_is_valid(exp)
    cfg = exp["configuration"]
    assert {"gpufleet_backend", "gpufleet_stack"} <= set(cfg)
    # The fault class comes from the fault in the catalog, never restated (issue 10).
    assert "gpufleet_fault_class" not in cfg
    # Tagged for exactly the backend it is written for (its probes fit that backend's workload).
    assert [t for t in exp["tags"] if t in ("sandbox", "slurm", "kubernetes")] == [cfg["gpufleet_backend"]]
    assert exp["method"][-1]["type"] == "probe" and exp["method"][-1]["name"] == "recovery-timeline"
    assert exp["rollbacks"], "every experiment declares its rollbacks"
    assert any(c["provider"]["module"] == "gpufleet.chaos.control" for c in exp["controls"])
    hypo = [p["provider"]["func"] for p in exp["steady-state-hypothesis"]["probes"]]
    assert "recovery_within_budget" in hypo
    for act in _activities(exp):
        prov = act["provider"]
        fn = getattr(importlib.import_module(prov["module"]), prov["func"])
        assert prov["func"] in importlib.import_module(prov["module"]).__all__
        kind = "probes" if act["type"] == "probe" else "actions"
        assert prov["module"].endswith(kind), f"{act['name']}: a {act['type']} from {prov['module']}"
        inspect.signature(fn).bind(**prov.get("arguments", {}), configuration=cfg, secrets=None)


def test_budgets_come_from_the_stack() -> None:
    from gpufleet.config import load_named_stack
    from gpufleet.core.taxonomy import FaultClass
    from gpufleet.gameday.suite import load_experiment

    stack = load_named_stack("sandbox", Path(__file__).parents[3] / "stacks")
    for path in EXPERIMENTS:
        exp = load_experiment(path)
        if "gpufleet_budget_override" not in exp.configuration:
            assert exp.fault_class is not None, path.stem
            assert FaultClass(exp.fault_class) in stack.slos.budgets, path.stem


def test_breach_experiment_has_an_unmeetable_budget() -> None:
    exp = json.loads((Path(__file__).parents[3] / "experiments" / "recovery-budget-breach.json").read_text())
    o = exp["configuration"]["gpufleet_budget_override"]
    assert max(o.values()) < 0.1 and "expect-deviation" in exp["tags"]


def test_catalog_faults_named_by_experiments_exist() -> None:
    ids = {f.id for f in load_catalog()}
    named = set()
    for path in EXPERIMENTS:
        for act in _activities(json.loads(path.read_text())):
            fid = act["provider"].get("arguments", {}).get("fault_id")
            if fid and act["provider"]["func"] == "inject_gpu_fault":
                named.add(fid)
    assert named, "no experiment injects a GPU fault from the catalog"
    assert named <= ids, f"experiments name faults the catalog lacks: {sorted(named - ids)}"
