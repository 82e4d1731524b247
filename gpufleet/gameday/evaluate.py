"""One experiment's journal + the stack's budgets -> a judged result (pure).

Three kinds of check make an experiment's result:
- the SLO checks of the run's verdict, which the chaos probe `recovery_within_budget` computed with
  `gpufleet.slo.judge_run` inside `chaos run` and Chaos Toolkit wrote into the journal: read here,
  never judged again (a run whose journal holds no verdict is UNKNOWN, with the reason);
- `steady-state`: the Chaos Toolkit hypothesis held after the method (journal not deviated);
- `rollbacks`: every declared rollback ran and succeeded (a fault must never outlive its run).
An experiment *meets* its expectation when the run checks pass and the SLO verdict equals the
expected outcome (PASS normally; FAIL for a breach test whose budget is set too tight on purpose).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.gameday.journal import JournalFacts
from gpufleet.gameday.suite import Experiment
from gpufleet.slo import (
    Budget,
    Check,
    Measurement,
    Outcome,
    Timeline,
    combine,
)
from gpufleet.slo.serving import ServingFigures


class Result(StrEnum):
    MET = "met"  # the verdict is the expected one and the run was clean
    MISSED = "missed"  # a target missed (or a breach test that passed, or a rollback failed)
    UNJUDGED = "unjudged"  # the run could not be judged (UNKNOWN)


@dataclass(frozen=True)
class ExperimentResult:
    name: str
    title: str
    file: str
    fault_id: str | None
    fault_class: str | None
    status: str  # the journal's status
    outcome: Outcome  # every check combined
    verdict: Outcome  # the SLO checks only
    expected: Outcome
    result: Result
    checks: tuple[Check, ...]
    measurement: Measurement | None
    budget: Budget | None
    budget_source: str | None  # "stack" | "override"
    notes: tuple[str, ...]
    timeline: Timeline | None
    journal: str | None  # path of the journal, relative to the report directory
    started_at: float
    wall_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    # What the runner healed before this experiment so it started from the steady state
    # (gpufleet.chaos.steady.HealReport.to_json()); None: the check was not run.
    healing: dict[str, Any] | None = None
    # The serving load the experiment ran under, as the verdict judged it (None: no load).
    serving: ServingFigures | None = None

    @property
    def expected_failure(self) -> bool:
        """A breach test that did what it must: its verdict FAILED, as expected."""
        return self.result is Result.MET and self.expected is Outcome.FAIL

    @property
    def result_label(self) -> str:
        """What reports print: `failed as expected` for a met breach test, else the result."""
        return "failed as expected" if self.expected_failure else self.result.value


def _steady_state(facts: JournalFacts) -> Check:
    """A deviation caused by the recovery-budget probe is the verdict itself: it counts once, in the
    SLO checks. Any other deviation fails the run."""
    name = "steady-state"
    if not facts.deviated:
        return Check(name, None, None, Outcome.PASS, "hypothesis held before and after")
    if facts.deviated_by_budget:
        return Check(name, None, None, Outcome.PASS,
                     f"only the recovery-budget probe {facts.deviated_by!r} deviated (its verdict above)")
    probe = f"probe {facts.deviated_by!r}" if facts.deviated_by else "the hypothesis"
    return Check(name, None, None, Outcome.FAIL, f"{probe} did not hold after the method (deviated)")


def _run_checks(experiment: Experiment, facts: JournalFacts) -> list[Check]:
    checks: list[Check] = []
    if facts.status == "completed":
        checks.append(_steady_state(facts))
    elif facts.status == "failed":
        checks.append(Check("steady-state", None, None, Outcome.UNKNOWN,
                            "the experiment failed before its method (steady state not met at start?)"))
    else:
        checks.append(Check("steady-state", None, None, Outcome.UNKNOWN, f"the run was {facts.status}"))
    if facts.status == "missing":
        checks.append(Check("rollbacks", None, None, Outcome.UNKNOWN,
                            "no journal: whether the rollbacks ran is unknown (the runner ran "
                            "`gpufleet chaos revert`)"))
    elif experiment.rollbacks == 0:
        checks.append(Check("rollbacks", None, None, Outcome.FAIL,
                            "the experiment declares no rollbacks: every fault needs one (STYLE.md 9)"))
    elif facts.rollbacks_failed:
        failed = ", ".join(facts.rollbacks_failed)
        checks.append(Check("rollbacks", None, None, Outcome.FAIL,
                            f"rollback(s) failed: {failed}; run `gpufleet chaos revert`"))
    elif facts.rollbacks_run < experiment.rollbacks:
        checks.append(Check("rollbacks", None, None, Outcome.FAIL,
                            f"only {facts.rollbacks_run} of {experiment.rollbacks} rollbacks ran"))
    else:
        detail = f"{facts.rollbacks_run} rollback(s) succeeded"
        checks.append(Check("rollbacks", None, None, Outcome.PASS, detail))
    return checks


def evaluate(
    experiment: Experiment,
    facts: JournalFacts,
    *,
    journal: str | None,
    started_at: float,
    wall_seconds: float,
    error: str | None = None,
) -> ExperimentResult:
    """Judge one experiment run. `error` is a runner failure (timeout, could not start)."""
    notes = [f"failed activity {a}" for a in facts.failed_activities]
    if error:
        notes.insert(0, error)
    verdict = facts.verdict
    timeline = facts.timeline
    if verdict is None:
        why = facts.verdict_problem or "no verdict in the journal"
        if facts.timeline is None and facts.timeline_problem:
            why += f" ({facts.timeline_problem})"
        slo_checks = [Check("verdict", None, None, Outcome.UNKNOWN, why)]
    else:
        notes.extend(verdict.notes)
        slo_checks = list(verdict.checks)
        if not slo_checks:
            slo_checks = [Check("verdict", None, None, Outcome.UNKNOWN,
                                "the verdict holds no check: the probe judged before any fault")]
    slo_outcome = combine([c.outcome for c in slo_checks])
    run_checks = _run_checks(experiment, facts)
    run_outcome = combine([c.outcome for c in run_checks])
    if run_outcome is Outcome.FAIL:
        result = Result.MISSED
    elif Outcome.UNKNOWN in (run_outcome, slo_outcome):
        result = Result.UNJUDGED
    else:
        result = Result.MET if slo_outcome is experiment.expect.outcome else Result.MISSED
    if experiment.expect.outcome is Outcome.FAIL and slo_outcome is Outcome.PASS:
        notes.append("a breach test PASSED: the too-tight budget was not enforced")
    extra: dict[str, Any] = {}
    cap = facts.capacity
    if cap is not None:
        extra["capacity"] = cap
        if cap.get("degraded"):
            notes.append(
                f"capacity degraded during the fault: {cap.get('min_schedulable')} of "
                f"{cap.get('nodes_total')} nodes schedulable at worst, {cap.get('nodes_needed')} needed "
                f"for full capacity (the spare was exhausted)"
            )
    return ExperimentResult(
        name=experiment.name,
        title=experiment.title,
        file=str(experiment.path),
        fault_id=timeline.fault_id if timeline else None,
        fault_class=verdict.fault_class if verdict else experiment.fault_class,
        status=facts.status,
        outcome=combine([c.outcome for c in slo_checks + run_checks]),
        verdict=slo_outcome,
        expected=experiment.expect.outcome,
        result=result,
        checks=tuple(slo_checks + run_checks),
        measurement=verdict.measurement if verdict else None,
        budget=verdict.budget if verdict else None,
        budget_source=verdict.budget_source if verdict else None,
        notes=tuple(notes),
        timeline=timeline,
        journal=journal,
        started_at=started_at,
        wall_seconds=wall_seconds,
        extra=extra,
        serving=verdict.serving if verdict else None,
    )


def suite_result(results: list[ExperimentResult]) -> Result:
    """missed beats unjudged beats met; an empty suite is unjudged (nothing ran, nothing passes)."""
    kinds = {r.result for r in results}
    if Result.MISSED in kinds:
        return Result.MISSED
    if not results or Result.UNJUDGED in kinds:
        return Result.UNJUDGED
    return Result.MET


EXIT_CODES = {Result.MET: 0, Result.MISSED: 1, Result.UNJUDGED: 3}
