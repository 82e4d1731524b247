"""One experiment's journal + the stack's budgets -> a judged result (pure).

Three kinds of check make an experiment's result:
- the SLO checks from `gpufleet.slo.judge` (detect / isolate / recover against the budget);
- `steady-state`: the Chaos Toolkit hypothesis held after the method (journal not deviated);
- `rollbacks`: every declared rollback ran and succeeded (a fault must never outlive its run).
An experiment *meets* its expectation when the run checks pass and the SLO verdict equals the
expected outcome (PASS normally; FAIL for a breach test whose budget is set too tight on purpose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.core.taxonomy import FaultClass
from gpufleet.gameday.journal import JournalFacts
from gpufleet.gameday.suite import Experiment
from gpufleet.slo import Budget, Check, Measurement, Outcome, Timeline, combine, judge, measure

# Which classes take the node out of service, and which interrupt the workload (gpu-faults.md:
# a fatal XID needs the GPU isolated; a contained ECC error restarts the job and keeps the node;
# degraded links and storage are ridden through). Experiments override per file (suite.py).
ISOLATING = frozenset({
    FaultClass.GPU_FATAL, FaultClass.NODE_CRASH, FaultClass.NODE_HANG,
    FaultClass.FABRIC_LINK_DOWN, FaultClass.FABRIC_SWITCH_DOWN,
})
STAYS_IN_SERVICE = frozenset({FaultClass.GPU_CONTAINED})
INTERRUPTING = ISOLATING | {FaultClass.GPU_CONTAINED}


def default_expect_isolation(fault_class: FaultClass) -> bool | None:
    if fault_class in ISOLATING:
        return True
    if fault_class in STAYS_IN_SERVICE:
        return False
    return None


def default_expect_interruption(fault_class: FaultClass) -> bool:
    return fault_class in INTERRUPTING


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

    @property
    def expected_failure(self) -> bool:
        """A breach test that did what it must: its verdict FAILED, as expected."""
        return self.result is Result.MET and self.expected is Outcome.FAIL

    @property
    def result_label(self) -> str:
        """What reports print: `failed as expected` for a met breach test, else the result."""
        return "failed as expected" if self.expected_failure else self.result.value


def budget_for(
    experiment: Experiment, stack_budgets: Mapping[str, Budget]
) -> tuple[Budget | None, str | None, str | None]:
    """(budget, source, problem). `gpufleet_budget_override` in the experiment's configuration
    replaces the stack's budget key by key; it accepts the chaos extension's snake_case keys and
    the stack file's camelCase keys."""
    fc = experiment.fault_class
    base = stack_budgets.get(fc) if fc else None
    override = experiment.configuration.get("gpufleet_budget_override")
    if override is None:
        if base is None:
            return None, None, f"the stack declares no budget for fault class {fc!r} (slos.budgets)"
        return base, "stack", None
    names = {
        "detect_seconds": "detect_seconds", "detectSeconds": "detect_seconds",
        "isolate_seconds": "isolate_seconds", "isolateSeconds": "isolate_seconds",
        "recover_seconds": "recover_seconds", "recoverSeconds": "recover_seconds",
    }
    if not isinstance(override, dict) or not set(override) <= set(names):
        return None, None, f"gpufleet_budget_override must map keys among {sorted(names)} to seconds"
    values: dict[str, float | None] = {}
    if base is not None:
        values = {
            "detect_seconds": base.detect_seconds, "isolate_seconds": base.isolate_seconds,
            "recover_seconds": base.recover_seconds,
        }
    for key, value in override.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None, None, f"gpufleet_budget_override.{key} must be a number of seconds"
        values[names[key]] = float(value)
    detect, recover = values.get("detect_seconds"), values.get("recover_seconds")
    if detect is None or recover is None:
        return None, None, "gpufleet_budget_override lacks detect/recover seconds and the stack has no budget"
    try:
        return Budget(detect, values.get("isolate_seconds"), recover), "override", None
    except ValueError as e:
        return None, None, f"gpufleet_budget_override: {e}"


def _steady_state(facts: JournalFacts, slo_outcome: Outcome) -> Check:
    """A deviation caused by the recovery-budget probe is the SLO verdict seen by Chaos Toolkit:
    it is judged (once) by the SLO checks; any other deviation fails the run."""
    name = "steady-state"
    if not facts.deviated:
        return Check(name, None, None, Outcome.PASS, "hypothesis held before and after")
    if facts.deviated_by_budget:
        if slo_outcome is Outcome.PASS:
            return Check(name, None, None, Outcome.UNKNOWN,
                         f"probe {facts.deviated_by!r} deviated but the game-day's verdict is PASS: they "
                         "judged different timelines or budgets")
        return Check(name, None, None, Outcome.PASS,
                     f"only the recovery-budget probe {facts.deviated_by!r} deviated (judged above)")
    probe = f"probe {facts.deviated_by!r}" if facts.deviated_by else "the hypothesis"
    return Check(name, None, None, Outcome.FAIL, f"{probe} did not hold after the method (deviated)")


def _run_checks(experiment: Experiment, facts: JournalFacts, slo_outcome: Outcome) -> list[Check]:
    checks: list[Check] = []
    if facts.status == "completed":
        checks.append(_steady_state(facts, slo_outcome))
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
    stack_budgets: Mapping[str, Budget],
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
    budget, source, budget_problem = budget_for(experiment, stack_budgets)
    timeline = facts.timeline
    fault_class = timeline.fault_class if timeline else experiment.fault_class
    slo_checks: list[Check] = []
    measurement: Measurement | None = None
    if timeline is not None and experiment.fault_class and timeline.fault_class != experiment.fault_class:
        notes.append(f"the timeline says fault class {timeline.fault_class!r}, the experiment "
                     f"{experiment.fault_class!r}: judged against the experiment's")
    if timeline is None:
        problem = facts.timeline_problem or "no timeline"
        slo_checks.append(Check("timeline", None, None, Outcome.UNKNOWN, problem))
    else:
        measurement = measure(timeline)
        notes.extend(measurement.notes)
    if budget is None:
        slo_checks.append(Check("budget", None, None, Outcome.UNKNOWN, budget_problem or "no budget"))
    try:
        fc = FaultClass(experiment.fault_class or fault_class or "")
    except ValueError:
        fc = None
        slo_checks.append(Check("fault-class", None, None, Outcome.UNKNOWN,
                                f"unknown fault class {experiment.fault_class or fault_class!r} "
                                "(configuration gpufleet_fault_class)"))
    if measurement is not None and budget is not None and fc is not None:
        ex = experiment.expect
        interruption = default_expect_interruption(fc) if ex.interruption is None else ex.interruption
        verdict = judge(
            measurement, budget,
            expect_isolation=ex.isolation if ex.isolation_set else default_expect_isolation(fc),
            expect_interruption=interruption,
        )
        slo_checks.extend(verdict.checks)
    slo_outcome = combine([c.outcome for c in slo_checks])
    run_checks = _run_checks(experiment, facts, slo_outcome)
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
        fault_class=fault_class,
        status=facts.status,
        outcome=combine([c.outcome for c in slo_checks + run_checks]),
        verdict=slo_outcome,
        expected=experiment.expect.outcome,
        result=result,
        checks=tuple(slo_checks + run_checks),
        measurement=measurement,
        budget=budget,
        budget_source=source,
        notes=tuple(notes),
        timeline=timeline,
        journal=journal,
        started_at=started_at,
        wall_seconds=wall_seconds,
        extra=extra,
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
