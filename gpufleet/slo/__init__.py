"""Pure SLO maths: recovery timelines -> detect / isolate / recover times, availability, verdicts."""

from gpufleet.slo.availability import availability, ettr
from gpufleet.slo.floor import Floor, Intervals, floor_seconds
from gpufleet.slo.measure import Measurement, measure
from gpufleet.slo.timeline import Event, EventKind, Timeline
from gpufleet.slo.verdict import Budget, Check, Outcome, Verdict, combine, judge

__all__ = [
    "Budget",
    "Check",
    "Event",
    "EventKind",
    "Floor",
    "Intervals",
    "Measurement",
    "Outcome",
    "Timeline",
    "Verdict",
    "availability",
    "combine",
    "ettr",
    "floor_seconds",
    "judge",
    "measure",
]
