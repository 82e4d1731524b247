"""The one judge (gpufleet.slo.judge_run): budget parsing, class defaults, UNKNOWN inputs."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gpufleet.core import FaultClass
from gpufleet.core.taxonomy import CLASS_TRAITS
from gpufleet.slo import (
    Budget,
    Expectations,
    Outcome,
    RunInputs,
    RunVerdict,
    Timeline,
    judge_run,
    parse_budget_override,
    resolve_budget,
)

Recorded = Callable[[str], Timeline]
STACK = {"gpu-fatal": Budget(15.0, 15.0, 60.0), "gpu-contained": Budget(15.0, None, 60.0)}


def test_every_class_has_its_traits() -> None:
    assert set(CLASS_TRAITS) == set(FaultClass)


@pytest.mark.parametrize(
    ("fc", "isolates", "interrupts"),
    [
        (FaultClass.GPU_FATAL, True, True),
        (FaultClass.GPU_CONTAINED, False, True),
        (FaultClass.GPU_DEGRADED, None, False),
        (FaultClass.NODE_CRASH, True, True),
        (FaultClass.NODE_HANG, True, True),
        (FaultClass.NODE_MAINTENANCE, True, False),
        (FaultClass.FABRIC_LINK_DOWN, True, True),
        (FaultClass.FABRIC_FLAP, None, True),
        (FaultClass.FABRIC_DEGRADED, None, False),
        (FaultClass.FABRIC_SWITCH_DOWN, True, True),
        (FaultClass.STORAGE_OUTAGE, None, False),
        (FaultClass.STORAGE_DEGRADED, None, False),
        (FaultClass.WORKLOAD, False, True),
    ],
)
def test_class_traits_table(fc: FaultClass, isolates: bool | None, interrupts: bool) -> None:
    assert (fc.isolates_node, fc.interrupts_training) == (isolates, interrupts)
    assert Expectations.of(fc) == Expectations(isolates, interrupts)


def test_given_expectations_win_over_the_class() -> None:
    assert Expectations.of(FaultClass.GPU_FATAL, False, False) == Expectations(False, False)
    assert Expectations.of(FaultClass.GPU_FATAL, None, False) == Expectations(True, False)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"detect_seconds": 1, "isolate_seconds": 2, "recover_seconds": 3}, Budget(1.0, 2.0, 3.0)),
        ({"detectSeconds": 5}, Budget(5.0, 15.0, 60.0)),
        ({"recoverSeconds": 20}, Budget(15.0, 15.0, 20.0)),
    ],
)
def test_override_replaces_key_by_key_in_both_styles(override: dict[str, float], expected: Budget) -> None:
    assert resolve_budget("gpu-fatal", STACK, override) == (expected, "override", None)


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ({"recover": 3}, "gpufleet_budget_override.recover: unknown key; known: detectSeconds"),
        ({"recoverSeconds": "fast"}, "gpufleet_budget_override.recoverSeconds must be a number of seconds"),
        ({"recoverSeconds": 0}, "gpufleet_budget_override.recoverSeconds must be positive (got 0)"),
        ({"recoverSeconds": 1, "recover_seconds": 2}, "gpufleet_budget_override.recover_seconds: "
                                                      "recover_seconds given twice"),
        ([1], "gpufleet_budget_override must map keys among"),
    ],
)
def test_bad_override_names_the_key(override: object, problem: str) -> None:
    b, source, p = resolve_budget("gpu-fatal", STACK, override)
    assert (b, source) == (None, None)
    assert p is not None and p.startswith(problem)
    with pytest.raises(ValueError, match="gpufleet_budget_override"):
        parse_budget_override(override)


def test_budget_from_the_stack_or_nothing() -> None:
    assert resolve_budget("gpu-fatal", STACK, None) == (STACK["gpu-fatal"], "stack", None)
    assert resolve_budget("node-crash", STACK, None) == (
        None, None, "the stack declares no budget for fault class 'node-crash' (slos.budgets)"
    )
    assert resolve_budget("node-crash", {}, {"detect_seconds": 1, "recover_seconds": 2}) == (
        Budget(1.0, None, 2.0), "override", None
    )
    assert resolve_budget("node-crash", {}, {"detect_seconds": 1})[2] == (
        "gpufleet_budget_override lacks detect/recover seconds and the stack has no budget"
    )


def test_a_fault_budget_replaces_its_keys_then_the_override_replaces_its_own() -> None:
    keys = {"detect_seconds": 10.0}
    assert resolve_budget("gpu-fatal", STACK, None, keys) == (Budget(10.0, 15.0, 60.0), "stack", None)
    assert resolve_budget("gpu-fatal", STACK, {"recoverSeconds": 30}, keys) == (
        Budget(10.0, 15.0, 30.0), "override", None)


def test_the_judge_uses_the_injected_fault_s_own_budget_keys(recorded: Recorded) -> None:
    tl = recorded("gpu_fatal_recovered")
    other = judge_run(RunInputs(tl, budgets=STACK, fault_budgets={"another-fault": {"detect_seconds": 1.0}}))
    assert other == judge_run(RunInputs(tl, budgets=STACK))  # another fault's keys change nothing
    tight = {tl.fault_id: {"detect_seconds": 0.001, "isolate_seconds": None, "recover_seconds": None}}
    v = judge_run(RunInputs(tl, budgets=STACK, fault_budgets=tight))
    assert v.budget == Budget(0.001, 15.0, 60.0) and v.outcome is Outcome.FAIL
    assert f"fault {tl.fault_id}'s own budget keys (slos.faultBudgets): detect_seconds 0.001 s" in v.notes


def test_left_out_arguments_judge_like_the_class_defaults(recorded: Recorded) -> None:
    tl = recorded("gpu_fatal_recovered")
    left_out = judge_run(RunInputs(tl, budgets=STACK))
    spelled = judge_run(RunInputs(tl, budgets=STACK, expect_isolation=True, expect_interruption=True))
    assert left_out == spelled
    assert left_out.outcome is Outcome.PASS
    assert left_out.expectations == Expectations(True, True)
    assert left_out.fault_class == tl.fault_class and left_out.budget_source == "stack"


def test_what_is_missing_is_unknown_never_a_pass(recorded: Recorded) -> None:
    v = judge_run(RunInputs(None, fault_class="meteor", timeline_problem="the probe failed"))
    assert v.outcome is Outcome.UNKNOWN
    assert [(c.name, c.detail) for c in v.checks] == [
        ("timeline", "the probe failed"),
        ("budget", "the stack declares no budget for fault class 'meteor' (slos.budgets)"),
        ("fault-class", "unknown fault class 'meteor' (configuration gpufleet_fault_class)"),
    ]
    assert v.measurement is None and v.expectations is None


def test_the_configured_class_wins_with_a_note(recorded: Recorded) -> None:
    tl = recorded("gpu_fatal_recovered")
    v = judge_run(RunInputs(tl, fault_class="gpu-contained", budgets=STACK))
    assert v.fault_class == "gpu-contained"
    assert v.notes[0] == (f"the timeline says fault class {tl.fault_class!r}, the experiment "
                          "'gpu-contained': judged against the experiment's")
    assert v.expectations == Expectations(False, True)


def test_the_verdict_document_carries_inputs_and_checks_and_reads_back(recorded: Recorded) -> None:
    """What the probe writes into the journal is what the game-day reads: JSON data, same verdict."""
    v = judge_run(RunInputs(recorded("gpu_fatal_recovered"), budgets=STACK))
    d = json.loads(json.dumps(v.to_doc()))
    assert d["outcome"] == "PASS" and d["budget_source"] == "stack"
    assert d["expectations"] == {"isolation": True, "interruption": True}
    assert [c["name"] for c in d["checks"]] == ["detect", "isolate", "recover"]
    assert RunVerdict.from_doc(d) == v
    with pytest.raises(ValueError):
        RunVerdict.from_doc({"outcome": "PASS", "before_fault": True})
