"""RPO/RTO verdicts of a drill (pure): PASS only when every check passes, UNKNOWN when unmeasured."""

from __future__ import annotations

import pytest

from gpufleet.slo import Outcome
from gpufleet.slo.dr import DrillInputs, DrillVerdict, DrTargets, RestoredCheckpoint, judge_drill

T = DrTargets(rpo_seconds=30, rto_seconds=60)


def _restored(written_at: float, step: int = 40, verified: bool = True) -> RestoredCheckpoint:
    return RestoredCheckpoint("ckpt", step, written_at, verified, None if verified else "shard: sha256")


@pytest.mark.parametrize(
    ("written_at", "verified_at", "outcome", "rpo", "rto"),
    [
        (990.0, 1020.0, Outcome.PASS, 10.0, 20.0),
        (970.0, 1060.0, Outcome.PASS, 30.0, 60.0),  # exactly at both targets
        (969.0, 1020.0, Outcome.FAIL, 31.0, 20.0),  # RPO missed by a second
        (990.0, 1060.5, Outcome.FAIL, 10.0, 60.5),  # RTO missed
    ],
)
def test_rpo_and_rto_against_the_targets(
    written_at: float, verified_at: float, outcome: Outcome, rpo: float, rto: float
) -> None:
    v = judge_drill(DrillInputs("d", T, 1000.0, verified_at, _restored(written_at), checkpoints_restored=3))
    assert (v.outcome, v.rpo_seconds, v.rto_seconds) == (outcome, rpo, rto)
    assert [c.name for c in v.checks] == ["rpo", "rto", "integrity"]


def test_a_restore_that_does_not_verify_fails_whatever_the_times() -> None:
    v = judge_drill(DrillInputs("d", T, 1000.0, 1001.0, _restored(999.0, verified=False),
                                checkpoints_restored=1, checkpoints_corrupt=1))
    assert v.outcome is Outcome.FAIL and v.rpo_seconds is None
    assert {c.name: c.outcome for c in v.checks} == {"rpo": Outcome.UNKNOWN, "rto": Outcome.PASS,
                                                      "integrity": Outcome.FAIL}


def test_nothing_restored_fails_and_unmeasured_is_unknown() -> None:
    assert judge_drill(DrillInputs("d", T, 1000.0, None, None)).outcome is Outcome.FAIL
    v = judge_drill(DrillInputs("d", None, 1000.0, 1010.0, _restored(995.0), checkpoints_restored=1))
    assert v.outcome is Outcome.UNKNOWN and v.rpo_seconds == 5.0  # measured, but no target to judge
    v = judge_drill(DrillInputs("d", T, None, 1010.0, _restored(995.0), checkpoints_restored=1))
    assert v.outcome is Outcome.UNKNOWN


def test_work_lost_and_resume_and_the_doc_round_trip() -> None:
    v = judge_drill(DrillInputs("d", T, 1000.0, 1020.0, _restored(990.0, step=40),
                                newest_before_failure=_restored(998.0, step=48), checkpoints_restored=2,
                                workload_resumed_at=1025.5))
    assert (v.steps_lost, v.resumed_after_seconds) == (8, 25.5)
    assert DrillVerdict.from_doc(v.to_doc()) == v
