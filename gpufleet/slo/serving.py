"""Request-level serving SLOs from per-request records (pure): availability, latency percentiles over
any window, the time until the error rate is back under a threshold, and the error budget burnt.

Two rules from what load tools get wrong (../shared/reference/anchors-ops.md, section 1):

- **Coordinated omission.** A closed-loop load generator sends nothing while it waits on a stalled
  request, so ok / sent flatters a stall. The load generator records every send its schedule asked
  for; a slot it could not use because its previous request was still in flight is a `missed`
  record, and counts as a failed request here.
- **Percentiles are never averaged.** Latencies go into log-bucketed histograms (relative bucket width
  `PRECISION`); histograms merge by adding counts, so per-second and per-worker histograms merge into
  exactly the histogram of the whole window, and a percentile read from it is within PRECISION / 2 of
  the exact nearest-rank value of the raw records.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Relative width of a latency bucket: a percentile read from a histogram is within 0.05% of the exact
# nearest-rank value (the midpoint of a bucket [b^i, b^(i+1)) is within (b-1)/2 of any value in it).
PRECISION = 0.001
_LOG_BASE = math.log1p(PRECISION)
_MIN_LATENCY_S = 1e-6  # latencies below 1 us share the first bucket


@dataclass(frozen=True)
class RequestRecord:
    """One request the schedule asked for. `t` is when it was due (the schedule's slot), `latency_s`
    how long it took (None for a missed slot), `ok` whether it succeeded (False for a missed slot)."""

    t: float
    latency_s: float | None
    ok: bool
    missed: bool = False

    def __post_init__(self) -> None:
        if self.missed and (self.ok or self.latency_s is not None):
            raise ValueError("a missed slot was never sent: it has no latency and cannot succeed")
        if not self.missed and self.latency_s is None:
            raise ValueError("a sent request has a latency")
        if self.latency_s is not None and (self.latency_s < 0 or not math.isfinite(self.latency_s)):
            raise ValueError(f"latency must be finite and >= 0, got {self.latency_s}")


def bucket_of(latency_s: float) -> int:
    return math.floor(math.log(max(latency_s, _MIN_LATENCY_S) / _MIN_LATENCY_S) / _LOG_BASE)


def bucket_value(index: int) -> float:
    """The midpoint of bucket `index` (seconds)."""
    return _MIN_LATENCY_S * math.exp(index * _LOG_BASE) * (1 + PRECISION / 2)


@dataclass
class Histogram:
    """Counts per latency bucket. Merging adds counts, so it is exact and order-free."""

    counts: Counter[int] = field(default_factory=Counter)

    def add(self, latency_s: float) -> None:
        self.counts[bucket_of(latency_s)] += 1

    def merge(self, other: Histogram) -> Histogram:
        return Histogram(self.counts + other.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> float | None:
        """Nearest-rank q-quantile (0 < q <= 1): the value of the ceil(q*n)-th smallest sample."""
        if not 0 < q <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {q}")
        n = self.total
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n - 1e-9))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return bucket_value(index)
        raise AssertionError("unreachable: rank <= total")


@dataclass
class Bin:
    """One second of the schedule: requests due in [t, t + 1)."""

    t: float
    due: int = 0
    ok: int = 0
    missed: int = 0
    latency_ok: Histogram = field(default_factory=Histogram)

    @property
    def failed(self) -> int:
        """Failed requests, missed slots included."""
        return self.due - self.ok

    @property
    def error_rate(self) -> float:
        return self.failed / self.due if self.due else 0.0

    def merge(self, other: Bin) -> Bin:
        if other.t != self.t:
            raise ValueError(f"cannot merge the bins of seconds {self.t} and {other.t}")
        return Bin(
            self.t,
            self.due + other.due,
            self.ok + other.ok,
            self.missed + other.missed,
            self.latency_ok.merge(other.latency_ok),
        )


def bin_records(records: Iterable[RequestRecord], origin: float) -> dict[int, Bin]:
    """Per-second bins keyed by whole seconds since `origin`."""
    bins: dict[int, Bin] = {}
    for r in records:
        k = math.floor(r.t - origin)
        b = bins.setdefault(k, Bin(origin + k))
        b.due += 1
        if r.missed:
            b.missed += 1
        elif r.ok:
            b.ok += 1
            assert r.latency_s is not None
            b.latency_ok.add(r.latency_s)
    return bins


def merge_bins(*workers: Mapping[int, Bin]) -> dict[int, Bin]:
    """The bins of several load-generator workers, second by second."""
    out: dict[int, Bin] = {}
    for bins in workers:
        for k, b in bins.items():
            out[k] = out[k].merge(b) if k in out else Bin(b.t).merge(b)
    return out


@dataclass(frozen=True)
class WindowStats:
    start: float
    end: float
    due: int
    ok: int
    missed: int
    p50_ms: float | None
    p99_ms: float | None

    @property
    def failed(self) -> int:
        return self.due - self.ok

    @property
    def availability(self) -> float | None:
        """Successful requests over the requests the schedule asked for (None: none were due)."""
        return self.ok / self.due if self.due else None


def window(bins: Mapping[int, Bin], start: float, end: float) -> WindowStats:
    """Totals and latency percentiles (successful requests) of the seconds that overlap [start, end):
    a fault at 6.3 s counts the requests of second 6 in its window."""
    chosen = [b for b in bins.values() if b.t + 1 > start and b.t < end]
    hist = Histogram()
    for b in chosen:
        hist = hist.merge(b.latency_ok)
    p50, p99 = hist.percentile(0.5), hist.percentile(0.99)
    return WindowStats(
        start=start,
        end=end,
        due=sum(b.due for b in chosen),
        ok=sum(b.ok for b in chosen),
        missed=sum(b.missed for b in chosen),
        p50_ms=None if p50 is None else p50 * 1000,
        p99_ms=None if p99 is None else p99 * 1000,
    )


def time_to_recover(
    bins: Mapping[int, Bin], fault_t: float, threshold: float, hold_s: int = 3
) -> float | None:
    """Seconds from the fault to the start of the first second (at or after the fault's) from which
    `hold_s` consecutive seconds each have an error rate <= threshold and requests due. None: never
    within the recorded bins (the run ended first: not recovered)."""
    if hold_s < 1:
        raise ValueError("hold_s must be >= 1")
    seconds = sorted(bins)
    if not seconds:
        return None
    origin = bins[seconds[0]].t - seconds[0]
    first = math.floor(fault_t - origin)
    for k in range(first, seconds[-1] - hold_s + 2):
        run = [bins.get(k + i) for i in range(hold_s)]
        if all(b is not None and b.due and b.error_rate <= threshold for b in run):
            return max(0.0, origin + k - fault_t)
    return None


def budget_burnt(failed: int, due: int, availability_target: float) -> float | None:
    """The share of the run's error budget these failures used: failed / (due * (1 - target)).
    1.0 = the whole budget; None when nothing was due."""
    if not 0 < availability_target < 1:
        raise ValueError(f"availability target must be in (0, 1), got {availability_target}")
    if due == 0:
        return None
    return failed / (due * (1 - availability_target))


@dataclass(frozen=True)
class ServingTargets:
    availability: float  # over the whole run, e.g. 0.999
    p99_ms: float
    recover_s: float
    window_availability: float = 0.99  # inside the fault window
    error_threshold: float = 0.01  # per-second error rate that counts as recovered


@dataclass(frozen=True)
class ServingCheck:
    name: str
    ok: bool | None  # None: not measurable (no requests due)
    value: float | None
    target: float
    detail: str


def judge(
    bins: Mapping[int, Bin], run: tuple[float, float], fault: tuple[float, float], targets: ServingTargets
) -> tuple[list[ServingCheck], dict[str, float | int | None]]:
    """Checks of one experiment under load: availability of the run and of the fault window, p99 of
    the fault window, time to recover, and the budget burnt (a figure, not a check)."""
    whole, during = window(bins, *run), window(bins, *fault)
    ttr = time_to_recover(bins, fault[0], targets.error_threshold)
    if not whole.due:
        recovered = ServingCheck("recover-s", None, None, targets.recover_s, "no requests were due")
    elif ttr is None:
        recovered = ServingCheck(
            "recover-s", False, None, targets.recover_s, "not recovered before the run ended"
        )
    else:
        recovered = ServingCheck(
            "recover-s",
            ttr <= targets.recover_s,
            ttr,
            targets.recover_s,
            f"{ttr:.1f} s (target <= {targets.recover_s:g} s)",
        )
    checks = [
        _at_least("availability", whole.availability, targets.availability),
        _at_least("window-availability", during.availability, targets.window_availability),
        _at_most("window-p99-ms", during.p99_ms, targets.p99_ms),
        recovered,
    ]
    figures: dict[str, float | int | None] = {
        "due": whole.due,
        "ok": whole.ok,
        "failed": whole.failed,
        "missed": whole.missed,
        "availability": whole.availability,
        "window_due": during.due,
        "window_failed": during.failed,
        "window_availability": during.availability,
        "window_p50_ms": during.p50_ms,
        "window_p99_ms": during.p99_ms,
        "p99_ms": whole.p99_ms,
        "recover_seconds": ttr,
        "budget_burnt": budget_burnt(whole.failed, whole.due, targets.availability) if whole.due else None,
    }
    return checks, figures


def _at_least(name: str, value: float | None, target: float) -> ServingCheck:
    if value is None:
        return ServingCheck(name, None, None, target, "no requests were due")
    return ServingCheck(name, value >= target, value, target, f"{value:.4%} (target >= {target:.2%})")


def _at_most(name: str, value: float | None, target: float) -> ServingCheck:
    if value is None:
        return ServingCheck(name, None, None, target, "no successful requests")
    return ServingCheck(name, value <= target, value, target, f"{value:.1f} (target <= {target:g})")


@dataclass(frozen=True)
class Second:
    """One second of a load, as the report plots it."""

    t: float
    due: int
    ok: int
    missed: int
    p99_ms: float | None


def series(bins: Mapping[int, Bin]) -> tuple[Second, ...]:
    out = []
    for k in sorted(bins):
        b = bins[k]
        p99 = b.latency_ok.percentile(0.99)
        out.append(Second(b.t, b.due, b.ok, b.missed, None if p99 is None else round(p99 * 1000, 3)))
    return tuple(out)


@dataclass(frozen=True)
class ServingRun:
    """What a serving load in an experiment recorded, and the targets it is judged against (None:
    the stack sets none). The run is the span of seconds in which requests were due; the fault
    window is the judge's (from the fault's injection to its revert)."""

    bins: Mapping[int, Bin]
    targets: ServingTargets | None
    url: str = ""
    # Why requests failed: "missed", "HTTP <status>" or the client's error, with how many of each.
    errors: Mapping[str, int] = field(default_factory=dict)

    @property
    def span(self) -> tuple[float, float] | None:
        if not self.bins:
            return None
        return min(b.t for b in self.bins.values()), max(b.t for b in self.bins.values()) + 1


@dataclass(frozen=True)
class ServingFigures:
    """The serving part of a verdict: the judged windows, the figures and the per-second series."""

    url: str
    run: tuple[float, float] | None
    fault: tuple[float, float] | None
    figures: dict[str, float | int | None]
    seconds: tuple[Second, ...]
    errors: dict[str, int] = field(default_factory=dict)  # ServingRun.errors
