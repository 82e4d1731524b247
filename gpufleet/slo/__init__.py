"""Pure SLO maths: recovery timelines -> detect / isolate / recover times, availability, verdicts."""

from gpufleet.slo.availability import availability, ettr
from gpufleet.slo.floor import Floor, Intervals, floor_seconds
from gpufleet.slo.measure import Measurement, measure
from gpufleet.slo.run import (
    BUDGET_KEYS,
    BudgetLike,
    Expectations,
    RunInputs,
    RunVerdict,
    as_budget,
    judge_run,
    parse_budget_override,
    resolve_budget,
)
from gpufleet.slo.timeline import Event, EventKind, Timeline
from gpufleet.slo.verdict import Budget, Check, Outcome, Verdict, combine, judge

__all__ = [
    "BUDGET_KEYS",
    "Budget",
    "BudgetLike",
    "Check",
    "Event",
    "EventKind",
    "Expectations",
    "Floor",
    "Intervals",
    "Measurement",
    "Outcome",
    "RunInputs",
    "RunVerdict",
    "Timeline",
    "Verdict",
    "as_budget",
    "availability",
    "combine",
    "ettr",
    "floor_seconds",
    "judge",
    "judge_run",
    "measure",
    "parse_budget_override",
    "resolve_budget",
]
