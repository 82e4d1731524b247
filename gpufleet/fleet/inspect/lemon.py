"""Lemon nodes (pure): nodes that keep coming out worst, or that jobs keep avoiding.

The rule (anchors-ops.md 3.3 item 2, after Meta's lemon-node detection in Kokolis et al.,
"Revisiting Reliability in Large-Scale ML Research Clusters", HPCA 2025, whose signals include the
count of jobs that excluded a node; removing lemons cut 512+ GPU job failures from 14 % to 4 %):
a node is a lemon when
  (a) at least BOTTOM_RUNS of its last WINDOW_RUNS sweeps went against it, or
  (b) jobs excluded it more than MAX_EXCLUSIONS times in the last EXCLUSION_WINDOW_S.
A sweep goes against a node when the node is at the bottom of its pool for a signal in it, or
failed a check in it (our addition: a node that fails its floor or flaps in sweep after sweep is
the same lemon whether or not its peers happen to be close behind).
"At the bottom" in one sweep, for one signal: among the worst ceil(BOTTOM_SHARE x pool) nodes (at
least one) AND at least Z_LIMIT robust deviations from the pool's median (scale = 1.4826 x median
absolute deviation, floored at the signal's MIN_SPREAD). The second condition is ours: someone is
always last, and in a pool of 5 the bottom 1 % is always one healthy node; a node must also be far
from its peers. MIN_SPREAD keeps a pool whose healthy nodes all read the same (0 ECC errors) from
turning the first single error into an infinite deviation.

Signals (direction): every performance result as % of its reference (higher is better); the
increase of correctable ECC errors since the node's previous sweep, and link flaps since it
(lower is better).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.fleet.inspect.history import NodeRecord

BOTTOM_SHARE = 0.01
BOTTOM_RUNS = 3
WINDOW_RUNS = 7
MAX_EXCLUSIONS = 2
EXCLUSION_WINDOW_S = 7 * 86400.0
Z_LIMIT = 3.0
# Signal -> the smallest spread the deviation is measured in (our choice, in the signal's unit):
# 2 percentage points of a performance result, one ECC error, one flap.
MIN_SPREAD = {"perf": 2.0, "ecc_correctable_increase": 1.0, "link_flaps": 1.0}


@dataclass(frozen=True)
class Lemon:
    node: str
    reason: str
    bottom_runs: int
    exclusions: int


def signals(record: NodeRecord, previous: NodeRecord | None) -> dict[str, float]:
    """The ranked signals of one record, all oriented so that LOWER is worse."""
    out: dict[str, float] = {}
    for k, v in record.metrics.items():
        if k.startswith("perf:") and k.endswith(":pct"):
            out[k] = v
    if "link_flaps" in record.metrics:
        out["link_flaps"] = -record.metrics["link_flaps"]
    if previous is not None and "ecc_correctable" in record.metrics and "ecc_correctable" in previous.metrics:
        rise = record.metrics["ecc_correctable"] - previous.metrics["ecc_correctable"]
        # A counter that went down was reset (GPU reset, reboot): the rise is what it reads now.
        out["ecc_correctable_increase"] = -(rise if rise >= 0 else record.metrics["ecc_correctable"])
    return out


def _min_spread(signal: str) -> float:
    return MIN_SPREAD["perf"] if signal.startswith("perf:") else MIN_SPREAD[signal]


def bottom_nodes(values: dict[str, float], signal: str) -> set[str]:
    """Nodes at the bottom of one sweep's pool for one signal (lower is worse)."""
    if len(values) < 2:
        return set()
    med = statistics.median(values.values())
    mad = statistics.median(abs(v - med) for v in values.values())
    scale = max(1.4826 * mad, _min_spread(signal))
    k = max(1, math.ceil(BOTTOM_SHARE * len(values)))
    worst = sorted(values, key=lambda n: (values[n], n))[:k]
    return {n for n in worst if (med - values[n]) / scale >= Z_LIMIT}


def bottom_runs(records: Iterable[NodeRecord]) -> dict[str, list[bool]]:
    """Per node, oldest first: whether each of its sweeps went against it (bottom of its pool, or a
    failed check)."""
    ordered = sorted(records, key=lambda r: r.at)
    prev: dict[str, NodeRecord] = {}
    by_run: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(dict)
    failed: set[tuple[str, str, str]] = set()
    run_order: list[tuple[str, str]] = []
    for r in ordered:
        key = (r.run_id, r.pool)
        if key not in by_run:
            run_order.append(key)
        by_run[key][r.node] = signals(r, prev.get(r.node))
        if r.status == "fail":
            failed.add((r.run_id, r.pool, r.node))
        prev[r.node] = r
    out: dict[str, list[bool]] = defaultdict(list)
    for key in run_order:
        nodes = by_run[key]
        bottom: set[str] = set()
        for signal in sorted({s for sig in nodes.values() for s in sig}):
            vals = {n: sig[signal] for n, sig in nodes.items() if signal in sig}
            bottom |= bottom_nodes(vals, signal)
        for n in nodes:
            out[n].append(n in bottom or (*key, n) in failed)
    return dict(out)


def lemons(records: Sequence[NodeRecord], now: float) -> list[Lemon]:
    runs = bottom_runs(records)
    excl: dict[str, int] = defaultdict(int)
    for r in records:
        if now - r.at <= EXCLUSION_WINDOW_S:
            excl[r.node] += int(r.metrics.get("job_exclusions", 0))
    out = []
    for node in sorted(set(runs) | set(excl)):
        recent = runs.get(node, [])[-WINDOW_RUNS:]
        n_bottom = sum(recent)
        reasons = []
        if n_bottom >= BOTTOM_RUNS:
            reasons.append(f"bottom of its pool or failing in {n_bottom} of its last {len(recent)} sweeps")
        if excl[node] > MAX_EXCLUSIONS:
            reasons.append(f"excluded by {excl[node]} jobs in 7 days")
        if reasons:
            out.append(Lemon(node, "; ".join(reasons), n_bottom, excl[node]))
    return out
