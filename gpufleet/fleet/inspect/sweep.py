"""One sweep, pure: observations + the history -> per-node results, the records to append, the
lemon list and the report's rows. The I/O (reading nodes, appending the history, writing files) is
the caller's (cli, sandbox.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.catalog import XidRule
from gpufleet.core.taxonomy import LadderAction
from gpufleet.fleet.inspect import history as H
from gpufleet.fleet.inspect.checks import Context, NodeResult, Pins, check_node
from gpufleet.fleet.inspect.lemon import Lemon, lemons
from gpufleet.fleet.inspect.observation import Level, NodeObservation
from gpufleet.fleet.inspect.plan import SweepPlan, plan_sweep
from gpufleet.fleet.inspect.reference import pool_references
from gpufleet.fleet.inspect.thresholds import Thresholds


@dataclass(frozen=True)
class Row:
    result: NodeResult
    reason: str  # why the full checks ran here or not (plan.py)
    deltas: dict[str, float]
    trends: dict[str, list[float]]
    lemon: Lemon | None


@dataclass(frozen=True)
class SweepOutcome:
    run_id: str
    stack: str
    level: Level
    at: float
    plan: SweepPlan
    rows: tuple[Row, ...]
    records: tuple[H.NodeRecord, ...]
    lemons: tuple[Lemon, ...]


def run_sweep(
    *, run_id: str, stack: str, level: Level, at: float, observations: Sequence[NodeObservation],
    past: Sequence[H.NodeRecord], thresholds: Thresholds, xid_rules: Mapping[int, XidRule],
    pins: Mapping[str, Pins], floor_percent: float | None = None,
    fault_actions: Mapping[str, LadderAction] | None = None,
) -> SweepOutcome:
    """`pins`: pool -> the stack's version pins. `floor_percent` None: thresholds' default."""
    floor = thresholds.defaults.perf_floor_percent.value if floor_percent is None else floor_percent
    plan = plan_sweep([(o.node, o.sched_state) for o in observations], level)
    full = {p.node: p for p in plan.nodes}
    # A node's performance counts only where the plan let the full checks run.
    refs = pool_references([o for o in observations if full[o.node].full], thresholds)
    previous = H.last_observations(past)
    past_by_node = H.by_node(past)
    results, records = [], []
    for o in observations:
        ctx = Context(thresholds, xid_rules, pins.get(o.pool, Pins()), refs.get(o.pool, {}), floor, level,
                      fault_actions or {})
        res = check_node(o, previous.get(o.node), ctx, full[o.node].full)
        results.append(res)
        records.append(H.record_of(run_id, stack, level, o, res))
    all_records = [*past, *records]
    lemon_list = lemons(all_records, at)
    by_lemon = {lm.node: lm for lm in lemon_list}
    merged = H.by_node(all_records)
    rows = []
    for res in results:
        before = past_by_node.get(res.node, [])
        trends = {m: H.trend(merged[res.node], m) for m in sorted(res.metrics)}
        rows.append(Row(res, full[res.node].reason, H.deltas(res.metrics, before[-1] if before else None),
                        trends, by_lemon.get(res.node)))
    return SweepOutcome(run_id, stack, level, at, plan, tuple(rows), tuple(records), tuple(lemon_list))
