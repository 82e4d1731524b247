from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.gameday import JournalFacts, read_journal

Facts = Callable[[str], JournalFacts]
JOURNALS = Path(__file__).parent / "fixtures" / "journals"


def raw(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((JOURNALS / f"{name}.json").read_text())
    return loaded


def test_timeline_from_the_recovery_timeline_probe(facts: Facts) -> None:
    f = facts("gpu-xid-79")
    assert f.status == "completed"
    assert f.deviated is False
    assert f.timeline is not None
    assert f.timeline.fault_id == "xid-79"
    assert len(f.timeline.events) == 7
    assert f.timeline_problem is None
    assert (f.rollbacks_run, f.rollbacks_failed, f.failed_activities) == (1, (), ())


def test_method_that_never_reached_the_probe(facts: Facts) -> None:
    f = facts("inject-fails")
    assert f.timeline is None
    assert f.timeline_problem == "the journal has no 'recovery_timeline' probe run (method did not reach it)"
    assert f.failed_activities == ("inject: ActivityFailed: agent socket refused",)


def test_failed_rollbacks_are_named(facts: Facts) -> None:
    assert facts("rollback-fails").rollbacks_failed == ("revert-0", "revert-1")


def test_failed_probe_and_bad_output() -> None:
    j = raw("gpu-xid-79")
    j["run"][1]["status"] = "failed"
    j["run"][1]["exception"] = "ActivityFailed: prometheus unreachable"
    assert read_journal(j).timeline_problem == (
        "the 'recovery_timeline' probe failed: ActivityFailed: prometheus unreachable"
    )
    j = raw("gpu-xid-79")
    j["run"][1]["output"] = {"experiment": "x"}
    problem = read_journal(j).timeline_problem
    assert problem is not None
    assert problem.startswith("the 'recovery_timeline' output is not a Timeline: 4 error(s)")


def test_no_journal() -> None:
    f = read_journal(None)
    assert (f.status, f.timeline, f.timeline_problem) == ("missing", None, "no journal was written")
