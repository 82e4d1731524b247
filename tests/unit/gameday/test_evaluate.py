from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from gpufleet.gameday import (
    EXIT_CODES,
    Experiment,
    ExperimentResult,
    JournalFacts,
    Result,
    evaluate,
    suite_result,
)
from gpufleet.gameday.suite import Expectations
from gpufleet.slo import Budget, Outcome

Exp = Callable[[str], Experiment]
Facts = Callable[[str], JournalFacts]


def run(exp: Experiment, facts: JournalFacts, budgets: dict[str, Budget]) -> ExperimentResult:
    return evaluate(exp, facts, budgets, journal="journals/x.json", started_at=0.0, wall_seconds=1.0)


def test_stack_budgets_convert(budgets: dict[str, Budget]) -> None:
    assert budgets["gpu-fatal"] == Budget(15.0, 15.0, 60.0)
    assert budgets["gpu-contained"] == Budget(15.0, None, 60.0)


def test_override_replaces_key_by_key(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("budget-breach"), facts("budget-breach"), budgets)
    assert (r.budget, r.budget_source) == (Budget(15.0, 15.0, 20.0), "override")


def test_bad_override_is_unjudged(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    exp = experiment("gpu-xid-79")
    exp = dataclasses.replace(
        exp, configuration={**exp.configuration, "gpufleet_budget_override": {"recoverSeconds": 0}}
    )
    r = run(exp, facts("gpu-xid-79"), budgets)
    assert r.result is Result.UNJUDGED and r.budget is None
    assert [c.detail for c in r.checks if c.name == "budget"] == [
        "gpufleet_budget_override.recoverSeconds must be positive (got 0)"
    ]


def test_missing_stack_budget_is_unjudged(experiment: Exp, facts: Facts) -> None:
    r = run(experiment("gpu-xid-79"), facts("gpu-xid-79"), {})
    assert r.result is Result.UNJUDGED
    assert r.checks[0].detail == "the stack declares no budget for fault class 'gpu-fatal' (slos.budgets)"


def test_recovered_within_budget_meets(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("gpu-xid-79"), facts("gpu-xid-79"), budgets)
    assert (r.verdict, r.outcome, r.result) == (Outcome.PASS, Outcome.PASS, Result.MET)
    assert [(c.name, c.outcome) for c in r.checks] == [
        ("detect", Outcome.PASS), ("isolate", Outcome.PASS), ("recover", Outcome.PASS),
        ("steady-state", Outcome.PASS), ("rollbacks", Outcome.PASS),
    ]
    assert r.measurement is not None and r.measurement.time_to_recover == 31.0
    assert (r.fault_id, r.fault_class, r.budget_source) == ("xid-79", "gpu-fatal", "stack")


def test_never_recovered_misses(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("node-crash"), facts("node-crash"), budgets)
    assert (r.verdict, r.result) == (Outcome.FAIL, Result.MISSED)


def test_breach_test_meets_when_it_fails(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("budget-breach"), facts("budget-breach"), budgets)
    assert (r.verdict, r.expected, r.result) == (Outcome.FAIL, Outcome.FAIL, Result.MET)
    recover = next(c for c in r.checks if c.name == "recover")
    assert (recover.measured, recover.budget, recover.outcome) == (31.0, 20.0, Outcome.FAIL)


def test_breach_test_that_passes_is_a_miss(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    exp = dataclasses.replace(experiment("gpu-xid-79"), expect=Expectations(outcome=Outcome.FAIL))
    r = run(exp, facts("gpu-xid-79"), budgets)
    assert (r.verdict, r.result) == (Outcome.PASS, Result.MISSED)
    assert r.notes[-1] == "a breach test PASSED: the too-tight budget was not enforced"


def test_no_timeline_is_unjudged(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("inject-fails"), facts("inject-fails"), budgets)
    assert (r.verdict, r.result) == (Outcome.UNKNOWN, Result.UNJUDGED)
    assert r.checks[0].name == "timeline"
    assert r.notes == ("failed activity inject: ActivityFailed: agent socket refused",)


def test_failed_rollback_is_a_miss_even_when_slo_passes(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    r = run(experiment("rollback-fails"), facts("rollback-fails"), budgets)
    assert r.verdict is Outcome.PASS
    assert r.result is Result.MISSED
    assert r.checks[-1].detail == "rollback(s) failed: revert-0, revert-1; run `gpufleet chaos revert`"


def test_skipped_rollbacks_and_no_rollbacks_fail(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    f = dataclasses.replace(facts("gpu-xid-79"), rollbacks_run=0)
    assert run(experiment("gpu-xid-79"), f, budgets).checks[-1].detail == "only 0 of 1 rollbacks ran"
    exp = dataclasses.replace(experiment("gpu-xid-79"), rollbacks=0)
    r = run(exp, facts("gpu-xid-79"), budgets)
    assert (r.checks[-1].outcome, r.result) == (Outcome.FAIL, Result.MISSED)


@pytest.mark.parametrize(
    ("status", "deviated", "outcome", "result"),
    [
        ("completed", True, Outcome.FAIL, Result.MISSED),
        ("failed", False, Outcome.UNKNOWN, Result.UNJUDGED),
        ("interrupted", False, Outcome.UNKNOWN, Result.UNJUDGED),
        ("aborted", False, Outcome.UNKNOWN, Result.UNJUDGED),
    ],
)
def test_steady_state(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget],
    status: str, deviated: bool, outcome: Outcome, result: Result,
) -> None:
    f = dataclasses.replace(facts("gpu-xid-79"), status=status, deviated=deviated)
    r = run(experiment("gpu-xid-79"), f, budgets)
    assert next(c for c in r.checks if c.name == "steady-state").outcome is outcome
    assert r.result is result


def test_runner_error_leads_the_notes(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = evaluate(experiment("inject-fails"), facts("inject-fails"), budgets, journal=None, started_at=0.0,
                 wall_seconds=300.0, error="timed out after 300 s and was stopped with SIGUSR1")
    assert r.notes[0] == "timed out after 300 s and was stopped with SIGUSR1"


def test_unknown_fault_class(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    exp = experiment("gpu-xid-79")
    exp = dataclasses.replace(exp, configuration={**exp.configuration, "gpufleet_fault_class": "meteor"})
    r = run(exp, facts("gpu-xid-79"), {**budgets, "meteor": Budget(1, None, 2)})
    assert r.result is Result.UNJUDGED
    assert any(c.name == "fault-class" and c.outcome is Outcome.UNKNOWN for c in r.checks)


def test_probe_arguments_left_out_take_the_class_defaults(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    """Leaving out the probe's arguments judges with the class's defaults: never unjudged."""
    given = run(experiment("gpu-xid-79"), facts("gpu-xid-79"), budgets)
    exp = dataclasses.replace(experiment("gpu-xid-79"), expect=Expectations())
    left_out = run(exp, facts("gpu-xid-79"), budgets)
    assert left_out.result is Result.MET
    assert left_out.checks == given.checks
    # An explicit argument still wins over the default: the fatal GPU must stay in service -> FAIL.
    stay = dataclasses.replace(experiment("gpu-xid-79"), expect=Expectations(isolation=False))
    assert run(stay, facts("gpu-xid-79"), budgets).verdict is Outcome.FAIL


def test_suite_result_and_exit_codes(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    met = run(experiment("gpu-xid-79"), facts("gpu-xid-79"), budgets)
    missed = run(experiment("node-crash"), facts("node-crash"), budgets)
    unjudged = run(experiment("inject-fails"), facts("inject-fails"), budgets)
    assert suite_result([met]) is Result.MET
    assert suite_result([met, unjudged]) is Result.UNJUDGED
    assert suite_result([unjudged, missed, met]) is Result.MISSED
    assert suite_result([]) is Result.UNJUDGED
    assert EXIT_CODES == {Result.MET: 0, Result.MISSED: 1, Result.UNJUDGED: 3}


def test_deviation_by_the_budget_probe_is_judged_once(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    f = facts("node-crash")
    assert (f.deviated, f.deviated_by, f.deviated_by_budget) == (True, "recovery-within-budget", True)
    r = run(experiment("node-crash"), f, budgets)
    steady = next(c for c in r.checks if c.name == "steady-state")
    assert steady.outcome is Outcome.PASS
    assert steady.detail == "only the recovery-budget probe 'recovery-within-budget' deviated (judged above)"
    assert r.result is Result.MISSED  # by the recover check


def test_budget_probe_disagreeing_with_the_verdict_is_unknown(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    f = dataclasses.replace(facts("gpu-xid-79"), deviated=True, deviated_by="recovery-within-budget",
                            deviated_by_budget=True)
    r = run(experiment("gpu-xid-79"), f, budgets)
    assert (r.verdict, r.result) == (Outcome.PASS, Result.UNJUDGED)


def test_deviation_by_another_probe_fails(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    f = dataclasses.replace(facts("gpu-xid-79"), deviated=True, deviated_by="training-progressing")
    r = run(experiment("gpu-xid-79"), f, budgets)
    steady = next(c for c in r.checks if c.name == "steady-state")
    assert (steady.outcome, steady.detail) == (
        Outcome.FAIL, "probe 'training-progressing' did not hold after the method (deviated)"
    )
    assert r.result is Result.MISSED


def test_breach_journal_meets(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    f = facts("budget-breach")
    assert f.deviated_by_budget is True
    assert run(experiment("budget-breach"), f, budgets).result is Result.MET
