"""What the game-day reads of an experiment and its journal, and the one rule that finds it.

An activity is found by the extension function it calls (`provider.module` + `provider.func`, the
extension's public API, gpufleet.chaos.workload.probes `__all__`), never by the activity's `name`,
which an experiment's author chooses freely. The same rule serves the experiment file (the budget
probe's arguments), the journal's method runs (the timeline, the capacity) and its steady-state
probes (which probe deviated).
"""

from __future__ import annotations

from typing import Any

PROBES_MODULE = "gpufleet.chaos.workload.probes"
TIMELINE_PROBE = "recovery_timeline"  # the method's last probe; output: gpufleet.slo.Timeline
BUDGET_PROBE = "recovery_within_budget"  # steady-state probe; its arguments are the expectations
CAPACITY_PROBE = "capacity_during_fault"  # optional method probe; output: a capacity summary


def activity_of(entry: Any) -> dict[str, Any]:
    """The activity of a journal run entry, or the activity itself (an experiment's probe)."""
    if not isinstance(entry, dict):
        return {}
    inner = entry.get("activity")
    if isinstance(inner, dict):
        return inner
    return entry


def calls(entry: Any, func: str) -> bool:
    """Whether `entry` (an experiment activity or a journal run of one) calls probe `func` of the
    extension's probe module."""
    provider = activity_of(entry).get("provider")
    return (
        isinstance(provider, dict)
        and provider.get("module") == PROBES_MODULE
        and provider.get("func") == func
    )


def name_of(entry: Any) -> str:
    """The activity's name, for messages only."""
    return str(activity_of(entry).get("name", "?"))
