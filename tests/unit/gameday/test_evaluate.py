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
    return evaluate(exp, facts, journal="journals/x.json", started_at=0.0, wall_seconds=1.0)


def test_stack_budgets_convert(budgets: dict[str, Budget]) -> None:
    assert budgets["gpu-fatal"] == Budget(15.0, 15.0, 60.0)
    assert budgets["gpu-contained"] == Budget(15.0, None, 60.0)


def test_override_replaces_key_by_key(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    r = run(experiment("budget-breach"), facts("budget-breach"), budgets)
    assert (r.budget, r.budget_source) == (Budget(15.0, 15.0, 20.0), "override")


def test_the_verdict_is_read_from_the_journal_not_judged_again(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget]
) -> None:
    """The game-day reads the verdict the recovery-budget probe wrote: another stack's budgets or
    a different override in the experiment file change nothing here."""
    f = facts("gpu-xid-79")
    assert f.verdict is not None and f.verdict.outcome is Outcome.PASS
    exp = experiment("gpu-xid-79")
    other = dataclasses.replace(exp, configuration={**exp.configuration,
                                                    "gpufleet_budget_override": {"recoverSeconds": 1}})
    slo = ("detect", "isolate", "recover")
    assert [c for c in run(other, f, {}).checks if c.name in slo] == list(f.verdict.checks)
    assert [c for c in run(exp, f, budgets).checks if c.name in slo] == list(f.verdict.checks)


def test_a_journal_without_a_verdict_is_unjudged_with_the_reason(
    experiment: Exp, facts: Facts
) -> None:
    why = "no 'recovery_within_budget' probe ran after the method: no verdict"
    f = dataclasses.replace(facts("gpu-xid-79"), verdict=None, verdict_problem=why)
    r = run(experiment("gpu-xid-79"), f, {})
    assert r.result is Result.UNJUDGED and r.measurement is None
    assert r.checks[0].detail == why


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
    assert (r.checks[0].name, r.checks[0].detail) == (
        "verdict", "the 'recovery_within_budget' probe failed: ActivityFailed: faults were injected but "
        "no recovery timeline was built (the journal has no 'recovery_timeline' probe run (method did "
        "not reach it))")
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
    r = evaluate(experiment("inject-fails"), facts("inject-fails"), journal=None, started_at=0.0,
                 wall_seconds=300.0, error="timed out after 300 s and was stopped with SIGUSR1")
    assert r.notes[0] == "timed out after 300 s and was stopped with SIGUSR1"


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
    assert steady.detail == (
        "only the recovery-budget probe 'recovery-within-budget' deviated (its verdict above)")
    assert r.result is Result.MISSED  # by the recover check


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
