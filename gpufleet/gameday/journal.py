"""Read a Chaos Toolkit journal: the verdict, the recovery timeline, run status and rollback facts
(pure).

The experiment's method ends with the probe `recovery_timeline` whose output is
`Timeline.model_dump(mode="json")`, and the hypothesis after it holds the probe
`recovery_within_budget` whose output is the run's verdict (`RunVerdict.to_doc()`): the contract
with gpufleet.chaos. Every entry is found by the
one rule of gpufleet.gameday.contract: by the extension function it calls. Journal fields follow
conventions.md: `status` completed|failed|aborted|interrupted, `deviated`, `run[]`,
`rollbacks[]`, each activity run with `activity`, `status`, `output`, `start`, `end`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpufleet.gameday.contract import BUDGET_PROBE, CAPACITY_PROBE, TIMELINE_PROBE, calls, name_of
from gpufleet.slo import RunVerdict, Timeline


@dataclass(frozen=True)
class JournalFacts:
    status: str  # completed | failed | aborted | interrupted | missing
    deviated: bool
    timeline: Timeline | None
    timeline_problem: str | None  # why there is no timeline
    rollbacks_run: int
    rollbacks_failed: tuple[str, ...]  # names of rollbacks whose status is not succeeded
    failed_activities: tuple[str, ...]  # method activities that failed (name: error)
    deviated_by: str | None = None  # the steady-state probe (after the method) that missed tolerance
    deviated_by_budget: bool = False  # ...and it is the recovery-budget probe (its verdict)
    capacity: dict[str, Any] | None = None  # output of the capacity_during_fault probe, if run
    # The run's SLO verdict as the recovery-budget probe wrote it after the method (judged once,
    # inside `chaos run`); None with the reason when the probe did not run or failed.
    verdict: RunVerdict | None = None
    verdict_problem: str | None = "no journal"


def _capacity(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    for r in reversed(runs):
        if calls(r, CAPACITY_PROBE) and r.get("status") == "succeeded" and isinstance(r.get("output"), dict):
            out: dict[str, Any] = r["output"]
            return out
    return None


def _deviation(journal: dict[str, Any]) -> tuple[str | None, bool]:
    """chaoslib stops the hypothesis at the first probe that misses its tolerance
    (chaoslib/hypothesis.py), so that probe is the last one recorded with tolerance_met false."""
    after = (journal.get("steady_states") or {}).get("after") or {}
    probes = [p for p in after.get("probes") or [] if isinstance(p, dict)]
    missed = [p for p in probes if p.get("tolerance_met") is False]
    if not missed:
        return None, False
    return name_of(missed[-1]), calls(missed[-1], BUDGET_PROBE)


def _verdict(journal: dict[str, Any]) -> tuple[RunVerdict | None, str | None]:
    """The verdict the recovery-budget probe returned in the hypothesis after the method."""
    after = (journal.get("steady_states") or {}).get("after")
    if not isinstance(after, dict):
        return None, "the steady-state hypothesis did not run after the method: no verdict"
    probes = [p for p in after.get("probes") or [] if calls(p, BUDGET_PROBE)]
    if not probes:
        return None, f"no {BUDGET_PROBE!r} probe ran after the method: no verdict"
    run = probes[-1]
    if run.get("status") != "succeeded":
        return None, f"the {BUDGET_PROBE!r} probe failed: {str(run.get('exception') or '')[:300]}"
    try:
        return RunVerdict.from_doc(run.get("output")), None
    except ValidationError as e:
        return None, f"the {BUDGET_PROBE!r} output is not a verdict: {e.errors()[0]['msg']}"


def read_journal(journal: Any) -> JournalFacts:
    if not isinstance(journal, dict):
        return JournalFacts("missing", False, None, "no journal was written", 0, (), ())
    runs = [r for r in journal.get("run") or [] if isinstance(r, dict)]
    rollbacks = [r for r in journal.get("rollbacks") or [] if isinstance(r, dict)]
    failed = tuple(
        f"{name_of(r)}: {str(r.get('exception') or r.get('output') or 'failed').strip()[:300]}"
        for r in runs if r.get("status") != "succeeded"
    )
    timeline: Timeline | None = None
    problem: str | None = None
    probes = [r for r in runs if calls(r, TIMELINE_PROBE)]
    if not probes:
        problem = f"the journal has no {TIMELINE_PROBE!r} probe run (method did not reach it)"
    else:
        last = probes[-1]
        if last.get("status") != "succeeded":
            problem = f"the {TIMELINE_PROBE!r} probe failed: {str(last.get('exception') or '')[:300]}"
        else:
            try:
                timeline = Timeline.model_validate(last.get("output"))
            except ValidationError as e:
                problem = f"the {TIMELINE_PROBE!r} output is not a Timeline: {e.error_count()} error(s), " \
                    f"first: {e.errors()[0]['msg']}"
    deviated_by, by_budget = _deviation(journal)
    verdict, verdict_problem = _verdict(journal)
    return JournalFacts(
        status=str(journal.get("status", "missing")),
        deviated=bool(journal.get("deviated", False)),
        timeline=timeline,
        timeline_problem=problem,
        rollbacks_run=len(rollbacks),
        capacity=_capacity(runs),
        rollbacks_failed=tuple(name_of(r) for r in rollbacks if r.get("status") != "succeeded"),
        failed_activities=failed,
        deviated_by=deviated_by,
        deviated_by_budget=by_budget,
        verdict=verdict,
        verdict_problem=verdict_problem,
    )
