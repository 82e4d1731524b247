"""Measurement + budget -> verdict (pure).

Recovery budgets are enforced: a time over budget or a workload that never resumed FAILS the run
(the opposite of krkn #670, where budgets were measured but never enforced). A time that could not
be measured makes the check UNKNOWN; only a run whose every check passed is a PASS (STYLE.md 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.slo.measure import Measurement


@dataclass(frozen=True)
class Budget:
    """Seconds from the fault allowed for detection, isolation and recovery of one fault class.

    Callers convert the stack's `FaultBudget` (gpufleet.config) into this: `slo` sits in the same
    layer as `config` and must not import it.
    """

    detect_seconds: float
    isolate_seconds: float | None
    recover_seconds: float

    def __post_init__(self) -> None:
        for name in ("detect_seconds", "isolate_seconds", "recover_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"budget {name} must be positive (got {value})")


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class Check:
    name: str  # "detect", "isolate", "recover"
    measured: float | None
    budget: float | None
    outcome: Outcome
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "budget": self.budget,
            "outcome": self.outcome.value,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    checks: tuple[Check, ...]
    measurement: Measurement

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "checks": [c.to_dict() for c in self.checks],
            "measurement": self.measurement.to_dict(),
        }


def combine(outcomes: list[Outcome]) -> Outcome:
    """FAIL beats UNKNOWN beats PASS; nothing to combine is UNKNOWN, never a pass."""
    if Outcome.FAIL in outcomes:
        return Outcome.FAIL
    if not outcomes or Outcome.UNKNOWN in outcomes:
        return Outcome.UNKNOWN
    return Outcome.PASS


def _timed(name: str, measured: float | None, budget: float, missing: str) -> Check:
    if measured is None:
        return Check(name, None, budget, Outcome.UNKNOWN, missing)
    if measured > budget:
        detail = f"{measured:.1f} s exceeds the {budget:g} s budget"
        return Check(name, measured, budget, Outcome.FAIL, detail)
    return Check(name, measured, budget, Outcome.PASS, f"{measured:.1f} s within the {budget:g} s budget")


def _detect(m: Measurement, budget: Budget) -> Check:
    missing = "no detection event after the fault: the alert/health-check source was not read or the fault " \
        "went unnoticed; the run cannot be judged"
    return _timed("detect", m.time_to_detect, budget.detect_seconds, missing)


def _isolate(m: Measurement, budget: Budget, expect: bool | None) -> Check | None:
    if expect is None:
        return None
    if not expect:
        if m.time_to_isolate is None:
            detail = "node stayed in service, as this fault class expects"
            return Check("isolate", None, None, Outcome.PASS, detail)
        return Check(
            "isolate", m.time_to_isolate, None, Outcome.FAIL,
            f"node isolated {m.time_to_isolate:.1f} s after the fault, but this fault class should leave "
            "it in service (capacity lost for nothing)",
        )
    if budget.isolate_seconds is None:
        return Check(
            "isolate", m.time_to_isolate, None, Outcome.UNKNOWN,
            "isolation is expected but the budget has no isolateSeconds: add one to the stack's slos.budgets",
        )
    missing = (
        "no isolation event (drain/cordon) after the fault: scheduler source not read or node never isolated"
    )
    return _timed("isolate", m.time_to_isolate, budget.isolate_seconds, missing)


def _recover(m: Measurement, budget: Budget, expect: bool) -> Check:
    limit = budget.recover_seconds
    if m.interrupted is None:
        return Check("recover", None, limit, Outcome.UNKNOWN, "no workload source: recovery cannot be judged")
    if not m.interrupted:
        if expect:
            return Check(
                "recover", None, limit, Outcome.UNKNOWN,
                "the workload was not interrupted although this fault should interrupt it: the injection "
                "may not have taken effect, so the recovery path was not exercised",
            )
        return Check("recover", 0.0, limit, Outcome.PASS, "the workload was not interrupted, as expected")
    if not m.recovered:
        return Check("recover", None, limit, Outcome.FAIL, "the workload never resumed after the fault")
    check = _timed("recover", m.time_to_recover, limit, "")
    if not expect:
        note = " (the workload was interrupted though this fault should not interrupt it)"
        check = Check(check.name, check.measured, check.budget, check.outcome, check.detail + note)
    return check


def judge(
    measurement: Measurement,
    budget: Budget,
    *,
    expect_isolation: bool | None = True,
    expect_interruption: bool = True,
) -> Verdict:
    """Judge one measured fault against its budget.

    expect_isolation: True = the node must be isolated within budget.isolate_seconds; False = the
    node must stay in service (e.g. a contained ECC error: the job restarts, the node stays);
    None = isolation is not judged.
    expect_interruption: False for faults the workload should ride through (degraded link); then an
    uninterrupted workload passes the recovery check.
    """
    checks = [_detect(measurement, budget)]
    iso = _isolate(measurement, budget, expect_isolation)
    if iso is not None:
        checks.append(iso)
    checks.append(_recover(measurement, budget, expect_interruption))
    if measurement.injected_at is None:
        checks = [Check(c.name, c.measured, c.budget, Outcome.UNKNOWN,
                        "no injection event: " + c.detail) if c.outcome is Outcome.PASS else c
                  for c in checks]
    return Verdict(combine([c.outcome for c in checks]), tuple(checks), measurement)
