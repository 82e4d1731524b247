"""Consistency between the repository's experiments/ (written for gpufleet.chaos) and the game-day:
every experiment can be judged — it parses, ends its method with the recovery-timeline probe,
names a fault class, has a budget in the sandbox stack (or an override) and declares rollbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.gameday import TIMELINE_PROBE, budget_for, discover, select, stack_budgets

REPO = Path(__file__).parents[3]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.json"))

pytestmark = pytest.mark.skipif(not EXPERIMENTS, reason="experiments/ is empty")


def test_every_experiment_can_be_judged() -> None:
    budgets = stack_budgets("sandbox", REPO / "stacks")
    problems = []
    for exp in discover(REPO / "experiments"):
        method = json.loads(exp.path.read_text())["method"]
        if method[-1].get("name") != TIMELINE_PROBE:
            problems.append(f"{exp.name}: the method must end with the {TIMELINE_PROBE!r} probe")
        if exp.rollbacks == 0:
            problems.append(f"{exp.name}: no rollbacks")
        budget, _, why = budget_for(exp, budgets)
        if budget is None:
            problems.append(f"{exp.name}: {why}")
    assert problems == []


def test_the_sandbox_suite_has_a_breach_test() -> None:
    suite = select(discover(REPO / "experiments"), "sandbox", None)
    assert suite, "no experiment is tagged sandbox"
    assert any(e.expect.outcome.value == "FAIL" for e in suite), "the suite needs a budget-breach test"
