"""Availability over a window and effective training time ratio (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Interval = tuple[float, float | None]  # (start, end); end None = still unavailable at window end


def _merged_seconds(intervals: Sequence[Interval], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the union of `intervals` (overlaps counted once)."""
    clipped = sorted(
        (max(a, start), min(end if b is None else b, end))
        for a, b in intervals
    )
    total = 0.0
    cur_a: float | None = None
    cur_b = start
    for a, b in clipped:
        if b <= a:
            continue
        if cur_a is None or a > cur_b:
            if cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None:
        total += cur_b - cur_a
    return total


def availability(
    intervals: Mapping[str, Sequence[Interval]], window: tuple[float, float], nodes_total: int
) -> float:
    """Node-seconds available / node-seconds total over `window`.

    `intervals` maps a node name to the times it was unavailable (drained, down, cordoned).
    Intervals are clipped to the window and overlaps on one node count once, so the result is
    always within [0, 1] (a score above 100 % is a bug, STYLE.md's Litmus counter-example).
    """
    start, end = window
    if end <= start:
        raise ValueError(f"window end {end} is not after its start {start}")
    if nodes_total < 1:
        raise ValueError(f"nodes_total must be at least 1 (got {nodes_total})")
    if len(intervals) > nodes_total:
        raise ValueError(f"{len(intervals)} nodes were unavailable but the cluster has only {nodes_total}")
    for node, spans in intervals.items():
        for a, b in spans:
            if b is not None and b < a:
                raise ValueError(f"node {node}: interval ends ({b}) before it starts ({a})")
    down = sum(_merged_seconds(spans, start, end) for spans in intervals.values())
    return 1.0 - down / (nodes_total * (end - start))


def ettr(productive_seconds: float, wall_seconds: float) -> float:
    """Effective training time ratio: productive time / wall time (failure-data.md: Meta's and
    ByteDance's figure of merit). Productive time is time whose progress was kept, i.e. wall time
    minus detection, restart, checkpoint load and recomputed (lost) steps."""
    if wall_seconds <= 0:
        raise ValueError(f"wall time must be positive (got {wall_seconds})")
    if not 0 <= productive_seconds <= wall_seconds:
        raise ValueError(f"productive time {productive_seconds} must lie in [0, wall time {wall_seconds}]")
    return productive_seconds / wall_seconds
