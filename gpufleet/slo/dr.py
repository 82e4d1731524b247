"""A disaster-recovery drill's verdict: RPO and RTO against the stack's targets (pure).

The drill's measurements, all taken from real artefacts by the drill's probe:
- `failed_at`: when the fault was applied (the fault ledger's entry);
- `restored`: the newest checkpoint a restore brought back, with the time its manifest was written
  (the checkpoint's age) and whether every file verified by sha256 against its manifest;
- `restore_verified_at`: when the restore ended with every restored checkpoint verified;
- `newest_before_failure`: the newest complete checkpoint written before the fault (what was lost
  is what lies between it and the restored one).

RPO = failed_at - restored.written_at: the work a failure loses, as the age at the failure of the
newest checkpoint that could be brought back verified. RTO = restore_verified_at - failed_at.
A check whose measurement is missing is UNKNOWN; a restored checkpoint that does not verify, or
none at all, FAILS the integrity check; the drill PASSES only when every check passes (the same
rule as `judge_run`'s, with the same Check and Outcome, ADR 0031/0042).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from gpufleet.slo.verdict import Check, Outcome


@dataclass(frozen=True)
class RestoredCheckpoint:
    name: str  # e.g. ckpt-0000000001-000000-000000042
    step: int
    written_at: float
    verified: bool
    problem: str | None = None


@dataclass(frozen=True)
class DrTargets:
    rpo_seconds: float
    rto_seconds: float


@dataclass(frozen=True)
class DrillInputs:
    drill: str
    targets: DrTargets | None
    failed_at: float | None
    restore_verified_at: float | None
    restored: RestoredCheckpoint | None
    newest_before_failure: RestoredCheckpoint | None = None
    checkpoints_restored: int = 0
    checkpoints_corrupt: int = 0
    workload_resumed_at: float | None = None  # first new work after the restore, when measured
    problems: tuple[str, ...] = ()  # what the probe could not measure, said in the verdict
    # What the integrity check says instead of the checkpoint wording (a drill that restores
    # something else, e.g. the scheduler's jobs, counts those in checkpoints_restored/_corrupt).
    integrity_detail: str | None = None


@dataclass(frozen=True)
class DrillVerdict:
    drill: str
    outcome: Outcome
    checks: tuple[Check, ...]
    rpo_seconds: float | None
    rto_seconds: float | None
    steps_lost: int | None
    resumed_after_seconds: float | None
    notes: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return _VERDICT.dump_python(self, mode="json")  # type: ignore[no-any-return]

    @staticmethod
    def from_doc(doc: Any) -> DrillVerdict:
        return _VERDICT.validate_python(doc)


_VERDICT: TypeAdapter[DrillVerdict] = TypeAdapter(DrillVerdict)


def _timed(name: str, measured: float | None, target: float | None, why_missing: str) -> Check:
    if target is None:
        return Check(name, measured, None, Outcome.UNKNOWN, "the stack declares no dr target")
    if measured is None:
        return Check(name, None, target, Outcome.UNKNOWN, why_missing)
    ok = measured <= target
    return Check(name, round(measured, 3), target, Outcome.PASS if ok else Outcome.FAIL,
                 f"{measured:.1f} s {'<=' if ok else '>'} target {target:g} s")


def judge_drill(inputs: DrillInputs) -> DrillVerdict:
    t = inputs.targets
    notes = list(inputs.problems)
    rpo: float | None = None
    rto: float | None = None
    r = inputs.restored
    if inputs.failed_at is not None and r is not None and r.verified:
        rpo = max(inputs.failed_at - r.written_at, 0.0)
    if inputs.failed_at is not None and inputs.restore_verified_at is not None:
        rto = inputs.restore_verified_at - inputs.failed_at
        if rto < 0:
            notes.append("the restore was verified before the fault: the drill measured nothing")
            rto = None
    if r is None:
        integrity = Check("integrity", 0, None, Outcome.FAIL, "no checkpoint was restored")
    elif not r.verified or inputs.checkpoints_corrupt:
        integrity = Check("integrity", inputs.checkpoints_corrupt, 0, Outcome.FAIL,
                          f"{inputs.checkpoints_corrupt} restored checkpoint(s) do not verify"
                          + (f": {r.problem}" if r.problem else ""))
    else:
        integrity = Check("integrity", inputs.checkpoints_corrupt, 0, Outcome.PASS,
                          f"{inputs.checkpoints_restored} checkpoint(s) restored, every file verified "
                          "by sha256")
    checks = (
        _timed("rpo", rpo, t.rpo_seconds if t else None,
               "no verified restored checkpoint, or no fault time: the age of the data lost is unknown"),
        _timed("rto", rto, t.rto_seconds if t else None, "the restore was never verified"),
        integrity,
    )
    if inputs.integrity_detail is not None and r is not None:
        checks = (*checks[:2], Check("integrity", integrity.measured, integrity.budget, integrity.outcome,
                                     inputs.integrity_detail))
    if any(c.outcome is Outcome.FAIL for c in checks):
        outcome = Outcome.FAIL
    elif all(c.outcome is Outcome.PASS for c in checks):
        outcome = Outcome.PASS
    else:
        outcome = Outcome.UNKNOWN
    lost = None
    if r is not None and inputs.newest_before_failure is not None:
        lost = max(inputs.newest_before_failure.step - r.step, 0)
    resumed = None
    if inputs.workload_resumed_at is not None and inputs.failed_at is not None:
        resumed = round(inputs.workload_resumed_at - inputs.failed_at, 3)
    return DrillVerdict(inputs.drill, outcome, checks, None if rpo is None else round(rpo, 3),
                        None if rto is None else round(rto, 3), lost, resumed, tuple(notes))
