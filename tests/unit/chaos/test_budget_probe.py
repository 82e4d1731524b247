"""The chaos probe judges with the one judge (gpufleet.slo.judge_run) and the game-day's inputs:
left-out arguments are the class defaults, the override is read by the one parser."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from chaoslib.hypothesis import within_tolerance

from gpufleet.chaos import engine
from gpufleet.chaos.settings import parse_settings
from gpufleet.chaos.workload import probes
from gpufleet.slo import Outcome, RunInputs, RunVerdict, Timeline, judge_run

TIMELINE = Path(__file__).parents[1] / "slo" / "fixtures" / "gpu_fatal_recovered.json"


@pytest.fixture
def run_with_timeline() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(TIMELINE.read_text())
    return doc


def _judge(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], **args: Any) -> bool:
    """Whether the hypothesis holds: the probe's output under the experiments' tolerance, as
    chaoslib itself evaluates it; the output must be the verdict, readable back."""
    run = engine.RunState(experiment="t")
    run.timelines.append(json.loads(TIMELINE.read_text()))
    ctx = SimpleNamespace(settings=parse_settings(config), stack=None, run=run)
    monkeypatch.setattr(engine, "context", lambda configuration: ctx)
    doc = probes.recovery_within_budget(configuration=config, **args)
    held = within_tolerance(dict(probes.BUDGET_TOLERANCE), doc)
    assert held is (RunVerdict.from_doc(doc).outcome is Outcome.PASS)
    return bool(held)


def test_before_any_fault_the_hypothesis_holds_with_nothing_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = SimpleNamespace(settings=parse_settings({}), stack=None, run=engine.RunState(experiment="t"),
                          ledger=SimpleNamespace(records=lambda: []))
    monkeypatch.setattr(engine, "context", lambda configuration: ctx)
    doc = probes.recovery_within_budget(configuration={})
    assert doc["before_fault"] is True and within_tolerance(dict(probes.BUDGET_TOLERANCE), doc)


def test_left_out_arguments_are_the_class_defaults(
    monkeypatch: pytest.MonkeyPatch, run_with_timeline: dict[str, Any]
) -> None:
    config = {"gpufleet_budget_override": {"detectSeconds": 15, "isolateSeconds": 15, "recoverSeconds": 60}}
    assert _judge(monkeypatch, config) is True  # gpu-fatal: isolation and interruption expected
    assert _judge(monkeypatch, config, expect_isolation=False) is False  # an explicit argument wins
    tl = Timeline.model_validate(run_with_timeline)
    same = judge_run(RunInputs(tl, budget_override=config["gpufleet_budget_override"]))
    assert same.outcome is Outcome.PASS


def test_a_breach_deviates(monkeypatch: pytest.MonkeyPatch, run_with_timeline: dict[str, Any]) -> None:
    config = {"gpufleet_budget_override": {"detect_seconds": 0.001, "recover_seconds": 0.001}}
    assert _judge(monkeypatch, config) is False


def test_no_budget_is_not_a_pass(monkeypatch: pytest.MonkeyPatch, run_with_timeline: dict[str, Any]) -> None:
    assert _judge(monkeypatch, {}) is False  # no stack, no override: UNKNOWN, so the run deviates
