"""Pure SLO maths: recovery timelines -> detect / isolate / recover times, availability, verdicts."""

from gpufleet.slo.timeline import Event, EventKind, Timeline

__all__ = ["Event", "EventKind", "Timeline"]
