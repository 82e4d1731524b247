"""Timeline -> measured recovery times (pure).

Every time is seconds from the fault's injection. A time that cannot be measured because its
source reported nothing is None (the verdict turns it into UNKNOWN, never into a pass, STYLE.md
point 8). Edge cases are explained in `Measurement.notes` so a report can show why a number is
missing. The rules, with their reasons, are written down in docs/slo.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpufleet.slo.availability import availability
from gpufleet.slo.timeline import Event, EventKind, Timeline


@dataclass(frozen=True)
class Measurement:
    """What one fault injection cost, measured from its timeline."""

    time_to_detect: float | None  # injected -> first detection (alert firing / health check)
    time_to_isolate: float | None  # injected -> node drained / cordoned / GPU fenced
    time_to_recover: float | None  # injected -> the workload's first step after the fault
    time_to_return: float | None  # injected -> the node schedulable again
    lost_steps: int | None  # steps_at_fault - resumed_from_step
    recovered: bool  # the workload made progress again after an interruption
    availability: float | None  # node-seconds available / node-seconds total over the window
    notes: tuple[str, ...] = ()
    injected_at: float | None = None  # Unix seconds of the (first) injection
    # True: the workload stalled or restarted after the fault; False: the workload source was read
    # and shows no interruption; None: no workload source, nothing known.
    interrupted: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out


def _after(events: list[Event], kind: EventKind, t: float) -> Event | None:
    """The earliest event of `kind` at or after `t`."""
    hits = [e for e in events if e.kind is kind and e.at >= t]
    return min(hits, key=lambda e: e.at) if hits else None


def _since(event: Event | None, t0: float) -> float | None:
    return None if event is None else event.at - t0


def measure(timeline: Timeline) -> Measurement:
    """Measure detect / isolate / recover / return times, lost steps and availability."""
    notes: list[str] = []
    avail = _window_availability(timeline, notes)
    injections = sorted((e for e in timeline.events if e.kind is EventKind.INJECTED), key=lambda e: e.at)
    if not injections:
        notes.append("no injection event: nothing can be measured (was the fault ledger read?)")
        return Measurement(None, None, None, None, None, False, avail, tuple(notes))
    t0 = injections[0].at
    if len(injections) > 1:
        others = ", ".join(f"+{e.at - t0:.1f} s" for e in injections[1:])
        notes.append(
            f"{len(injections)} injections in one timeline (overlapping faults; others at {others}): "
            "every time is measured from the first injection"
        )
    early = [e for e in timeline.events if e.at < t0]
    if early:
        kinds = ", ".join(sorted({e.kind.value for e in early}))
        notes.append(f"{len(early)} event(s) before the injection ignored ({kinds})")
    events = [e for e in timeline.events if e.at >= t0]

    detected = _after(events, EventKind.DETECTED, t0)
    isolated = _after(events, EventKind.ISOLATED, t0)
    stalled = _after(events, EventKind.INTERRUPTED, t0)
    # A resume counts only after the interruption it ends (when the stall was seen at all).
    resumed = _after(events, EventKind.RESUMED, stalled.at if stalled else t0)
    # The node returns from an isolation; without one, any return after the fault counts.
    returned = _after(events, EventKind.RETURNED, isolated.at if isolated else t0)

    workload_seen = timeline.steps_at_fault is not None or stalled is not None or resumed is not None
    interrupted: bool | None
    if stalled is not None or resumed is not None:
        interrupted = True
    elif workload_seen:
        interrupted = False
        notes.append("the workload was not interrupted by the fault (no stall, no restart)")
    else:
        interrupted = None
        notes.append("no workload source (no step facts, no stall or resume event): recovery unknown")

    recovered = resumed is not None
    if interrupted and not recovered:
        seen = timeline.window_end - t0
        notes.append(f"the workload never resumed within the window (observed {seen:.1f} s after the fault)")
    if detected is None:
        notes.append("no detection event after the injection")
    if resumed is not None and detected is not None and resumed.at < detected.at:
        notes.append(
            f"the workload resumed {detected.at - resumed.at:.1f} s before the fault was detected: "
            "the fault did not interrupt training long enough to be noticed first"
        )
    if returned is not None and detected is not None and returned.at < detected.at:
        notes.append("the node was schedulable again before the fault was detected")

    lost: int | None = None
    if timeline.steps_at_fault is not None and timeline.resumed_from_step is not None:
        diff = timeline.steps_at_fault - timeline.resumed_from_step
        if diff < 0:
            notes.append(
                f"resumed from step {timeline.resumed_from_step}, after the last step before the fault "
                f"({timeline.steps_at_fault}): step facts inconsistent, lost work unknown"
            )
        else:
            lost = diff

    return Measurement(
        time_to_detect=_since(detected, t0),
        time_to_isolate=_since(isolated, t0),
        time_to_recover=_since(resumed, t0),
        time_to_return=_since(returned, t0),
        lost_steps=lost,
        recovered=recovered,
        availability=avail,
        notes=tuple(notes),
        injected_at=t0,
        interrupted=interrupted,
    )


def _window_availability(timeline: Timeline, notes: list[str]) -> float | None:
    if timeline.nodes_total is None:
        notes.append("node count unknown (no scheduler source): availability unknown")
        return None
    if timeline.window_end <= timeline.window_start:
        notes.append("empty observation window: availability unknown")
        return None
    try:
        return availability(
            timeline.nodes_unavailable, (timeline.window_start, timeline.window_end), timeline.nodes_total
        )
    except ValueError as e:
        notes.append(f"availability unknown: {e}")
        return None
