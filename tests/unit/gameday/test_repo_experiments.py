"""Consistency between the repository's experiments/ (written for gpufleet.chaos) and the game-day:
every experiment can be judged — it parses, ends its method with the recovery_timeline probe,
judges in its hypothesis with recovery_within_budget, names a fault class, has a budget in the
sandbox stack (or an override) and declares rollbacks — and is judged with the expectations pinned
below (issue 10 made the probe's arguments optional: leaving them out must not change a verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.core import FaultClass
from gpufleet.gameday import BUDGET_PROBE, TIMELINE_PROBE, calls, discover, select, stack_budgets
from gpufleet.slo import Expectations, resolve_budget

REPO = Path(__file__).parents[3]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.json"))

pytestmark = pytest.mark.skipif(not EXPERIMENTS, reason="experiments/ is empty")


def test_every_experiment_can_be_judged() -> None:
    budgets = stack_budgets("sandbox", REPO / "stacks")
    problems = []
    for exp in discover(REPO / "experiments"):
        doc = json.loads(exp.path.read_text())
        if not calls(doc["method"][-1], TIMELINE_PROBE):
            problems.append(f"{exp.name}: the method must end with the {TIMELINE_PROBE!r} probe")
        if not any(calls(p, BUDGET_PROBE) for p in doc["steady-state-hypothesis"]["probes"]):
            problems.append(f"{exp.name}: no {BUDGET_PROBE!r} probe in the hypothesis: nothing judges")
        if exp.rollbacks == 0:
            problems.append(f"{exp.name}: no rollbacks")
        budget, _, why = resolve_budget(
            exp.fault_class, budgets, exp.configuration.get("gpufleet_budget_override")
        )
        if budget is None:
            problems.append(f"{exp.name}: {why}")
    assert problems == []


def test_the_sandbox_suite_has_a_breach_test() -> None:
    suite = select(discover(REPO / "experiments"), "sandbox", None)
    assert suite, "no experiment is tagged sandbox"
    assert any(e.expect.outcome.value == "FAIL" for e in suite), "the suite needs a budget-breach test"


# (expect_isolation, expect_interruption) each experiment is judged with, as before issue 10 (when
# every experiment spelled both out). None: isolation not judged.
JUDGED_WITH = {
    "amd-gpu-ecc-uncorrectable": (True, True),
    "amd-gpu-unhealthy": (True, True),
    "ascend-hbm-ecc-uncorrectable": (True, True),
    "ascend-link-down": (True, True),
    "ascend-npu-unhealthy": (True, True),
    "fabric-degraded": (None, False),
    "fabric-link-down": (True, True),
    "fabric-link-flap": (None, True),
    "fabric-nic-failure": (True, True),
    "fabric-switch-down": (True, True),
    "fabric-symbol-errors": (False, False),
    "gpu-xid45-burst-after-crash": (False, True),
    "gpu-xid48-double-bit-ecc": (True, True),
    "gpu-xid79-fallen-off-bus": (True, True),
    "gpu-xid79-idle-node": (True, False),
    "gpu-xid94-contained-ecc": (False, True),
    "k8s-fabric-port-down": (True, True),
    "k8s-gpu-xid79-quarantine-drain": (True, True),
    "k8s-node-crash": (True, True),
    "node-cpu-failure": (True, True),
    "node-crash": (True, True),
    "node-hang": (True, True),
    "node-memory-failure": (True, True),
    "node-psu-failure": (True, False),
    "node-ssd-failure": (True, False),
    "recovery-budget-breach": (True, True),
    "storage-checkpoint-outage": (None, False),
    "two-nodes-spare-exhausted": (True, True),
}


def test_every_experiment_keeps_its_expectations() -> None:
    judged = {}
    for exp in discover(REPO / "experiments"):
        assert exp.fault_class is not None, exp.name
        e = Expectations.of(FaultClass(exp.fault_class), exp.expect.isolation, exp.expect.interruption)
        judged[exp.name] = (e.isolation, e.interruption)
    assert judged == JUDGED_WITH
