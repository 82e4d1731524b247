"""One experiment run's inputs -> its SLO verdict: the one judge (pure, docs/adr/0031-one-judge.md).

The chaos probe `recovery_within_budget` (inside `chaos run`) and the game-day call `judge_run`
with the same `RunInputs`: the recovery timeline, the configured fault class, the stack's budgets,
the experiment's `gpufleet_budget_override` and the probe's two expectation arguments. Everything
that turns those into a verdict lives here and nowhere else:

- the budget: the stack's budget for the class, replaced key by key by the override, whose keys are
  the extension's snake_case (`detect_seconds`) or the stack file's camelCase (`detectSeconds`);
- the expectations: an argument left out (None) is the fault class's default
  (`FaultClass.isolates_node`, `FaultClass.interrupts_training` in gpufleet.core.taxonomy);
- what cannot be judged (no timeline, no budget, an unknown class) is an UNKNOWN check, never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import TypeAdapter

from gpufleet.core.taxonomy import FaultClass
from gpufleet.slo.measure import Measurement, measure
from gpufleet.slo.serving import ServingFigures, ServingRun, ServingTargets, series
from gpufleet.slo.serving import judge as judge_serving_checks
from gpufleet.slo.timeline import EventKind, Timeline
from gpufleet.slo.verdict import Budget, Check, Outcome, combine, judge

# Override key -> Budget field: the extension's snake_case and the stack file's camelCase.
BUDGET_KEYS: dict[str, str] = {
    "detect_seconds": "detect_seconds",
    "detectSeconds": "detect_seconds",
    "isolate_seconds": "isolate_seconds",
    "isolateSeconds": "isolate_seconds",
    "recover_seconds": "recover_seconds",
    "recoverSeconds": "recover_seconds",
}
OVERRIDE = "gpufleet_budget_override"


class BudgetLike(Protocol):
    """What a budget has: the stack's `FaultBudget` (gpufleet.config, which slo may not import)
    and `Budget` both fit."""

    @property
    def detect_seconds(self) -> float: ...
    @property
    def isolate_seconds(self) -> float | None: ...
    @property
    def recover_seconds(self) -> float: ...


def as_budget(b: BudgetLike) -> Budget:
    return Budget(b.detect_seconds, b.isolate_seconds, b.recover_seconds)


def parse_budget_override(value: Any) -> dict[str, float]:
    """The override as {Budget field: seconds}; ValueError naming every problem at once."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{OVERRIDE} must map keys among {sorted(BUDGET_KEYS)} to seconds")
    problems: list[str] = []
    out: dict[str, float] = {}
    for key, seconds in value.items():
        field = BUDGET_KEYS.get(str(key))
        if field is None:
            problems.append(f"{OVERRIDE}.{key}: unknown key; known: {', '.join(sorted(BUDGET_KEYS))}")
        elif not isinstance(seconds, int | float) or isinstance(seconds, bool):
            problems.append(f"{OVERRIDE}.{key} must be a number of seconds")
        elif not seconds > 0:
            problems.append(f"{OVERRIDE}.{key} must be positive (got {seconds})")
        elif field in out:
            problems.append(f"{OVERRIDE}.{key}: {field} given twice (snake_case and camelCase)")
        else:
            out[field] = float(seconds)
    if problems:
        raise ValueError("; ".join(problems))
    return out


def resolve_budget(
    fault_class: str | None,
    budgets: Mapping[str, BudgetLike],
    override: Any,
    fault_keys: Mapping[str, float] | None = None,
) -> tuple[Budget | None, str | None, str | None]:
    """(budget, source "stack" | "override", problem): the stack's budget for the class, with the
    fault's own keys (slos.faultBudgets, snake_case) in place of the class's, replaced key by key
    by the override."""
    base: BudgetLike | None = budgets.get(fault_class) if fault_class else None
    if base is not None and fault_keys:
        base = Budget(fault_keys.get("detect_seconds", base.detect_seconds),
                      fault_keys.get("isolate_seconds", base.isolate_seconds),
                      fault_keys.get("recover_seconds", base.recover_seconds))
    if override is None:
        if base is None:
            return None, None, f"the stack declares no budget for fault class {fault_class!r} (slos.budgets)"
        return as_budget(base), "stack", None
    try:
        values: dict[str, float | None] = dict(parse_budget_override(override))
    except ValueError as e:
        return None, None, str(e)
    if base is not None:
        values = {
            "detect_seconds": base.detect_seconds, "isolate_seconds": base.isolate_seconds,
            "recover_seconds": base.recover_seconds, **values,
        }
    detect, recover = values.get("detect_seconds"), values.get("recover_seconds")
    if detect is None or recover is None:
        return None, None, f"{OVERRIDE} lacks detect/recover seconds and the stack has no budget"
    return Budget(detect, values.get("isolate_seconds"), recover), "override", None


@dataclass(frozen=True)
class Expectations:
    """isolation: True = must be isolated within budget, False = must stay in service, None = not
    judged; interruption: False = the workload may ride the fault through."""

    isolation: bool | None
    interruption: bool

    @classmethod
    def of(
        cls, fault_class: FaultClass, isolation: bool | None = None, interruption: bool | None = None
    ) -> Expectations:
        """The given expectations; one left out (None) is the fault class's default."""
        return cls(
            fault_class.isolates_node if isolation is None else isolation,
            fault_class.interrupts_training if interruption is None else interruption,
        )


@dataclass(frozen=True)
class RunInputs:
    """Everything the verdict of one run depends on: nothing else is read."""

    timeline: Timeline | None
    fault_class: str | None = None  # configured (gpufleet_fault_class); None: the timeline's
    budgets: Mapping[str, BudgetLike] | None = None  # the stack's slos.budgets by class value
    budget_override: Any = None  # the experiment's gpufleet_budget_override, as written
    # The stack's slos.faultBudgets by fault id: the keys each fault sets (snake_case), rest None.
    fault_budgets: Mapping[str, Mapping[str, float | None]] | None = None
    expect_isolation: bool | None = None  # the probe's arguments; None: the class default
    expect_interruption: bool | None = None
    timeline_problem: str | None = None  # why there is no timeline
    # The serving load the experiment ran (docs/serving.md): judged against the stack's serving
    # targets over the run and the fault window, beside detect / isolate / recover.
    serving: ServingRun | None = None


@dataclass(frozen=True)
class RunVerdict:
    outcome: Outcome
    checks: tuple[Check, ...]
    measurement: Measurement | None
    fault_class: str | None
    budget: Budget | None
    budget_source: str | None  # "stack" | "override"
    expectations: Expectations | None
    notes: tuple[str, ...] = ()
    serving: ServingFigures | None = None

    def to_doc(self) -> dict[str, Any]:
        """The verdict as JSON data: what the chaos probe returns, so Chaos Toolkit writes it into
        the journal once, and what the game-day reads back (from_doc) instead of judging again."""
        return _VERDICT.dump_python(self, mode="json")  # type: ignore[no-any-return]

    @staticmethod
    def from_doc(doc: Any) -> RunVerdict:
        """ValueError (pydantic's ValidationError) when `doc` is not a verdict."""
        return _VERDICT.validate_python(doc)


_VERDICT: TypeAdapter[RunVerdict] = TypeAdapter(RunVerdict)


def judge_run(inputs: RunInputs) -> RunVerdict:
    """The SLO verdict of one run (docs/slo.md): detect / isolate / recover against the budget,
    plus an UNKNOWN `timeline`, `budget` or `fault-class` check for what is missing."""
    tl = inputs.timeline
    notes: list[str] = []
    checks: list[Check] = []
    name = inputs.fault_class or (tl.fault_class if tl is not None else None)
    if tl is not None and inputs.fault_class and tl.fault_class != inputs.fault_class:
        notes.append(f"the timeline says fault class {tl.fault_class!r}, the experiment "
                     f"{inputs.fault_class!r}: judged against the experiment's")
    measurement: Measurement | None = None
    if tl is None:
        why = inputs.timeline_problem or "no timeline"
        checks.append(Check("timeline", None, None, Outcome.UNKNOWN, why))
    else:
        measurement = measure(tl)
        notes.extend(measurement.notes)
    set_keys = (inputs.fault_budgets or {}).get(tl.fault_id, {}) if tl is not None else {}
    own = {k: v for k, v in set_keys.items() if v is not None}
    if own and tl is not None:
        shown = ", ".join(f"{k} {v:g} s" for k, v in sorted(own.items()))
        notes.append(f"fault {tl.fault_id}'s own budget keys (slos.faultBudgets): {shown}")
    budget, source, problem = resolve_budget(name, inputs.budgets or {}, inputs.budget_override, own)
    if budget is None:
        checks.append(Check("budget", None, None, Outcome.UNKNOWN, problem or "no budget"))
    fc: FaultClass | None = None
    try:
        fc = FaultClass(name or "")
    except ValueError:
        checks.append(Check("fault-class", None, None, Outcome.UNKNOWN,
                            f"unknown fault class {name!r} (configuration gpufleet_fault_class)"))
    expect = None if fc is None else Expectations.of(fc, inputs.expect_isolation, inputs.expect_interruption)
    if measurement is not None and budget is not None and expect is not None:
        verdict = judge(measurement, budget, expect_isolation=expect.isolation,
                        expect_interruption=expect.interruption)
        checks.extend(verdict.checks)
    serving: ServingFigures | None = None
    if inputs.serving is not None:
        serving_checks, serving = judge_serving(inputs.serving, tl)
        checks.extend(serving_checks)
    return RunVerdict(
        outcome=combine([c.outcome for c in checks]),
        checks=tuple(checks),
        measurement=measurement,
        fault_class=name,
        budget=budget,
        budget_source=source,
        expectations=expect,
        notes=tuple(notes),
        serving=serving,
    )


def fault_window(tl: Timeline | None, span: tuple[float, float]) -> tuple[float, float]:
    """From the first injection to the last revert of the run's faults; the load's span where the
    timeline does not say (no timeline, or a fault not reverted before the load ended)."""
    if tl is None:
        return span
    injected = [e.at for e in tl.events if e.kind == EventKind.INJECTED]
    reverted = [e.at for e in tl.events if e.kind == EventKind.REVERTED]
    start = min(injected) if injected else span[0]
    end = max(reverted) if reverted else span[1]
    return start, max(start, min(end, span[1]))


def judge_serving(run: ServingRun, tl: Timeline | None) -> tuple[list[Check], ServingFigures]:
    """The serving checks of a run (`serving-availability`, `serving-window-availability`,
    `serving-window-p99-ms`, `serving-recover-s`): UNKNOWN when no request was due or the stack sets
    no serving targets."""
    span = run.span
    if span is None:
        return ([Check("serving", None, None, Outcome.UNKNOWN, "the load recorded no request")],
                ServingFigures(run.url, None, None, {}, ()))
    fault = fault_window(tl, span)
    if run.targets is None:
        checks = [Check("serving", None, None, Outcome.UNKNOWN,
                        "the stack sets no serving targets (slos.serving)")]
        # The figures still say what happened; the budget burnt needs a target, so it is left out.
        _, figures = judge_serving_checks(run.bins, span, fault, ServingTargets(0.5, 1e9, 1e9))
        figures["budget_burnt"] = None
    else:
        found, figures = judge_serving_checks(run.bins, span, fault, run.targets)
        checks = [
            Check(f"serving-{c.name}", c.value, c.target,
                  Outcome.UNKNOWN if c.ok is None else Outcome.PASS if c.ok else Outcome.FAIL, c.detail)
            for c in found
        ]
    return checks, ServingFigures(run.url, span, fault, figures, series(run.bins), dict(run.errors))
