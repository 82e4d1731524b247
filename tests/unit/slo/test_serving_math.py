"""Request-level serving maths (gpufleet.slo.serving): recorded requests in, exact figures out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.slo.serving import (
    PRECISION,
    Histogram,
    RequestRecord,
    ServingTargets,
    bin_records,
    budget_burnt,
    judge,
    merge_bins,
    time_to_recover,
    window,
)

T0 = 1_000.0


def exact_percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of raw values: the reference the histogram is tested against."""
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s) - 1e-9)) - 1]


def steady(rate: int, seconds: int, latency: float = 0.02, start: float = T0) -> list[RequestRecord]:
    return [RequestRecord(start + s + i / rate, latency, True) for s in range(seconds) for i in range(rate)]


def test_a_missed_slot_counts_as_a_failed_request() -> None:
    # 10/s for 10 s; seconds 3 and 4 stall: the users send one request each second that times out
    # and miss the 9 other slots the schedule asked for.
    recs = [r for r in steady(10, 10) if not 3 <= r.t - T0 < 5]
    for s in (3, 4):
        recs.append(RequestRecord(T0 + s, 1.0, False))
        recs += [RequestRecord(T0 + s + i / 10, None, False, missed=True) for i in range(1, 10)]
    bins = bin_records(recs, T0)
    w = window(bins, T0, T0 + 10)
    assert (w.due, w.ok, w.missed, w.failed) == (100, 80, 18, 20)
    assert w.availability == 0.8
    # Counting only what was sent (the closed-loop figure) would have flattered it: 80 of 82.
    assert w.ok / (w.due - w.missed) == pytest.approx(0.9756, abs=1e-4)
    stall = window(bins, T0 + 3, T0 + 5)
    assert (stall.due, stall.ok, stall.availability, stall.p99_ms) == (20, 0, 0.0, None)
    # A window that starts inside a second counts that whole second.
    assert window(bins, T0 + 3.7, T0 + 4.2).due == 20 and window(bins, T0 + 2.5, T0 + 3).due == 10


def test_records_are_checked() -> None:
    with pytest.raises(ValueError, match="missed slot"):
        RequestRecord(T0, 0.1, False, missed=True)
    with pytest.raises(ValueError, match="has a latency"):
        RequestRecord(T0, None, True)
    with pytest.raises(ValueError, match="finite"):
        RequestRecord(T0, -1.0, True)


def test_time_to_recover_needs_consecutive_good_seconds() -> None:
    recs = steady(10, 20)
    bad = {5, 6, 7, 9}  # the fault at 5; second 8 is good once, then 9 fails again
    recs = [RequestRecord(r.t, r.latency_s, int(r.t - T0) not in bad) for r in recs]
    bins = bin_records(recs, T0)
    assert time_to_recover(bins, T0 + 5.4, threshold=0.01, hold_s=3) == pytest.approx(4.6)
    assert time_to_recover(bins, T0 + 5.4, threshold=0.01, hold_s=1) == pytest.approx(2.6)
    assert time_to_recover(bins, T0 + 5.0, threshold=1.0) == 0.0  # everything counts as recovered
    # The run ended before three good seconds in a row: not recovered.
    short = {k: b for k, b in bins.items() if k <= 11}
    assert time_to_recover(short, T0 + 5.4, threshold=0.01) is None


def test_budget_burnt() -> None:
    assert budget_burnt(5, 10_000, 0.999) == pytest.approx(0.5)
    assert budget_burnt(0, 10_000, 0.999) == 0.0
    assert budget_burnt(0, 0, 0.999) is None
    with pytest.raises(ValueError):
        budget_burnt(1, 10, 1.0)


def test_judge_reads_the_run_and_the_fault_window() -> None:
    recs = steady(20, 60)
    # A 2-second outage at 30 (every request fails), latencies high for the next 2 s.
    recs = [RequestRecord(r.t, r.latency_s, not 30 <= r.t - T0 < 32) for r in recs]
    recs = [RequestRecord(r.t, 0.4 if 32 <= r.t - T0 < 34 else r.latency_s, r.ok) for r in recs]
    bins = bin_records(recs, T0)
    targets = ServingTargets(availability=0.999, p99_ms=500, recover_s=10)
    checks, figs = judge(bins, (T0, T0 + 60), (T0 + 30, T0 + 40), targets)
    by = {c.name: c for c in checks}
    assert figs["due"] == 1200 and figs["failed"] == 40
    assert by["availability"].ok is False and by["availability"].value == pytest.approx(1160 / 1200)
    assert by["window-availability"].value == pytest.approx(160 / 200)
    assert by["window-p99-ms"].ok is True and by["window-p99-ms"].value == pytest.approx(400, rel=PRECISION)
    assert by["recover-s"].ok is True and by["recover-s"].value == pytest.approx(2.0)
    assert figs["budget_burnt"] == pytest.approx(40 / (1200 * 0.001))


def test_judge_with_no_requests_is_unknown_not_a_pass() -> None:
    checks, figs = judge(
        {}, (T0, T0 + 60), (T0 + 30, T0 + 40), ServingTargets(availability=0.999, p99_ms=500, recover_s=10)
    )
    assert [c.ok for c in checks] == [None, None, None, None]
    assert figs["budget_burnt"] is None


latencies = st.lists(st.floats(min_value=1e-4, max_value=30.0, allow_nan=False), min_size=1, max_size=400)


@settings(max_examples=200, deadline=None)
@given(latencies, st.sampled_from([0.5, 0.9, 0.99, 0.999, 1.0]))
def test_histogram_percentile_is_within_the_bucket_precision_of_the_exact_one(
    xs: list[float], q: float
) -> None:
    h = Histogram()
    for x in xs:
        h.add(x)
    got = h.percentile(q)
    assert got is not None
    assert abs(got - exact_percentile(xs, q)) <= exact_percentile(xs, q) * PRECISION / 2 * 1.0001


records = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=30, allow_nan=False),
        st.floats(min_value=1e-4, max_value=5.0, allow_nan=False),
        st.sampled_from(["ok", "error", "missed"]),
        st.integers(min_value=0, max_value=3),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(records)
def test_per_worker_bins_merge_into_exactly_the_single_process_result(
    rows: list[tuple[float, float, str, int]],
) -> None:
    def rec(t: float, lat: float, kind: str) -> RequestRecord:
        if kind == "missed":
            return RequestRecord(T0 + t, None, False, missed=True)
        return RequestRecord(T0 + t, lat, kind == "ok")

    everything = [rec(t, lat, kind) for t, lat, kind, _ in rows]
    per_worker = [
        bin_records([rec(t, lat, kind) for t, lat, kind, w in rows if w == n], T0) for n in range(4)
    ]
    merged, single = merge_bins(*per_worker), bin_records(everything, T0)
    assert merged.keys() == single.keys()
    for k in single:
        a, b = merged[k], single[k]
        assert (a.due, a.ok, a.missed, a.latency_ok.counts) == (b.due, b.ok, b.missed, b.latency_ok.counts)
    assert window(merged, T0, T0 + 31) == window(single, T0, T0 + 31)
