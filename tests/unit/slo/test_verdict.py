from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gpufleet.slo import Budget, Outcome, Timeline, combine, judge, measure

Load = Callable[[str], Timeline]
SANDBOX_GPU_FATAL = Budget(detect_seconds=15, isolate_seconds=15, recover_seconds=60)


def outcomes(v: object) -> dict[str, Outcome]:
    return {c.name: c.outcome for c in v.checks}  # type: ignore[attr-defined]


def test_within_budget_passes(recorded: Load) -> None:
    v = judge(measure(recorded("gpu_fatal_recovered")), SANDBOX_GPU_FATAL)
    assert v.outcome is Outcome.PASS
    assert [(c.name, c.measured, c.budget, c.outcome) for c in v.checks] == [
        ("detect", 3.5, 15, Outcome.PASS),
        ("isolate", 4.25, 15, Outcome.PASS),
        ("recover", 31.0, 60, Outcome.PASS),
    ]


def test_budget_breach_fails(recorded: Load) -> None:
    """A budget set too tight FAILS the run: budgets are enforced (krkn #670 is the opposite)."""
    v = judge(measure(recorded("gpu_fatal_recovered")), Budget(2.0, 15.0, 30.0))
    assert v.outcome is Outcome.FAIL
    assert outcomes(v) == {"detect": Outcome.FAIL, "isolate": Outcome.PASS, "recover": Outcome.FAIL}
    assert v.checks[0].detail == "3.5 s exceeds the 2 s budget"
    assert v.checks[2].detail == "31.0 s exceeds the 30 s budget"


def test_exactly_on_budget_passes(recorded: Load) -> None:
    v = judge(measure(recorded("gpu_fatal_recovered")), Budget(3.5, 4.25, 31.0))
    assert v.outcome is Outcome.PASS


def test_never_recovered_fails(recorded: Load) -> None:
    v = judge(measure(recorded("never_recovered")), Budget(30, 30, 60))
    assert v.outcome is Outcome.FAIL
    assert outcomes(v) == {"detect": Outcome.PASS, "isolate": Outcome.PASS, "recover": Outcome.FAIL}
    assert v.checks[2].detail == "the workload never resumed after the fault"


def test_missing_sources_are_unknown_never_pass(recorded: Load) -> None:
    v = judge(measure(recorded("missing_sources")), SANDBOX_GPU_FATAL)
    assert v.outcome is Outcome.UNKNOWN
    assert all(c.outcome is Outcome.UNKNOWN and c.measured is None for c in v.checks)


def test_fail_beats_unknown(recorded: Load) -> None:
    # Detection missing (UNKNOWN) but recovery over budget (FAIL): the run FAILS.
    m = measure(recorded("never_recovered"))
    v = judge(m, Budget(30, None, 60), expect_isolation=True)
    assert outcomes(v) == {"detect": Outcome.PASS, "isolate": Outcome.UNKNOWN, "recover": Outcome.FAIL}
    assert v.outcome is Outcome.FAIL


def test_isolation_without_budget_is_unknown(recorded: Load) -> None:
    v = judge(measure(recorded("gpu_fatal_recovered")), Budget(15, None, 60))
    assert v.outcome is Outcome.UNKNOWN
    assert v.checks[1].detail.startswith("isolation is expected but the budget has no isolateSeconds")


def test_isolation_not_judged_when_not_expected_either_way(recorded: Load) -> None:
    v = judge(measure(recorded("recovered_before_detection")), Budget(30, None, 90), expect_isolation=None)
    assert [c.name for c in v.checks] == ["detect", "recover"]
    assert v.outcome is Outcome.PASS


def test_contained_fault_must_not_isolate(recorded: Load) -> None:
    v = judge(measure(recorded("contained_isolated")), Budget(15, None, 60), expect_isolation=False)
    assert outcomes(v) == {"detect": Outcome.PASS, "isolate": Outcome.FAIL, "recover": Outcome.PASS}
    assert v.outcome is Outcome.FAIL


def test_ride_through_fault_passes_without_interruption(recorded: Load) -> None:
    m = measure(recorded("not_interrupted"))
    v = judge(m, Budget(30, None, 120), expect_isolation=None, expect_interruption=False)
    assert v.outcome is Outcome.PASS
    assert v.checks[1].measured == 0.0
    # The same run for a fault that SHOULD interrupt: the injection did not take, cannot judge.
    v2 = judge(m, Budget(30, None, 120), expect_isolation=None, expect_interruption=True)
    assert v2.outcome is Outcome.UNKNOWN


def test_unexpected_interruption_is_still_timed(recorded: Load) -> None:
    m = measure(recorded("gpu_fatal_recovered"))
    v = judge(m, Budget(15, 15, 20), expect_interruption=False)
    assert v.checks[2].outcome is Outcome.FAIL
    assert v.checks[2].detail.endswith(
        "(the workload was interrupted though this fault should not interrupt it)"
    )


def test_no_injection_never_passes(recorded: Load) -> None:
    v = judge(measure(recorded("no_injection")), Budget(15, None, 60), expect_isolation=False)
    assert v.outcome is Outcome.UNKNOWN
    assert all(c.outcome is Outcome.UNKNOWN for c in v.checks)


def test_verdict_to_dict_round_trips_through_json(recorded: Load) -> None:
    v = judge(measure(recorded("gpu_fatal_recovered")), SANDBOX_GPU_FATAL)
    d = json.loads(json.dumps(v.to_dict()))
    assert d["outcome"] == "PASS"
    assert d["checks"][0] == {
        "name": "detect", "measured": 3.5, "budget": 15, "outcome": "PASS",
        "detail": "3.5 s within the 15 s budget",
    }
    assert d["measurement"]["time_to_recover"] == 31.0


@pytest.mark.parametrize("bad", [(0, None, 1), (1, -1, 2), (1, None, 0)])
def test_budget_rejects_non_positive(bad: tuple[float, float | None, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Budget(*bad)


def test_combine() -> None:
    assert combine([]) is Outcome.UNKNOWN
    assert combine([Outcome.PASS, Outcome.PASS]) is Outcome.PASS
    assert combine([Outcome.PASS, Outcome.UNKNOWN]) is Outcome.UNKNOWN
    assert combine([Outcome.UNKNOWN, Outcome.FAIL, Outcome.PASS]) is Outcome.FAIL
