"""The inspection history: one append-only JSON-lines file per stack, one typed record per node per
sweep. It keeps the observation itself, because some checks are changes since the last sweep (link
flaps from carrier counters), and the figures the report trends and the lemon rule ranks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.jsonl import append_objects, parse_models, read_lines
from gpufleet.fleet.inspect.checks import NodeResult
from gpufleet.fleet.inspect.observation import Level, NodeObservation


class NodeRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    run_id: str
    at: float
    stack: str
    level: Level
    node: str
    pool: str
    status: str
    codes: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    observation: NodeObservation


def record_of(run_id: str, stack: str, level: Level, obs: NodeObservation, result: NodeResult) -> NodeRecord:
    return NodeRecord(run_id=run_id, at=obs.at, stack=stack, level=level, node=obs.node, pool=obs.pool,
                      status=result.status, codes=sorted({f.code for f in result.findings}),
                      metrics=dict(result.metrics), observation=obs)


def history_path(root: Path, stack: str) -> Path:
    return root / f"{stack}.jsonl"


def append(path: Path, records: Sequence[NodeRecord]) -> None:
    """One write per sweep with O_APPEND: a concurrent reader sees whole lines or a torn last one."""
    append_objects(path, (r.model_dump(mode="json") for r in records))


def load(path: Path) -> list[NodeRecord]:
    """Every record, oldest first; a line that is JSON but not a record raises ValueError naming it."""
    return sorted(parse_models(read_lines(path), NodeRecord, str(path), "an inspect history record"),
                  key=lambda r: r.at)


def by_node(records: Iterable[NodeRecord]) -> dict[str, list[NodeRecord]]:
    out: dict[str, list[NodeRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.at):
        out[r.node].append(r)
    return dict(out)


def last_observations(records: Iterable[NodeRecord]) -> dict[str, NodeObservation]:
    """Each node's most recent observation (the previous sweep for the next one's deltas)."""
    return {node: rs[-1].observation for node, rs in by_node(records).items()}


def deltas(current: dict[str, float], previous: NodeRecord | None) -> dict[str, float]:
    """Change of each figure since the node's last sweep (figures the last sweep did not have: none)."""
    if previous is None:
        return {}
    return {k: v - previous.metrics[k] for k, v in current.items() if k in previous.metrics}


def trend(records: Sequence[NodeRecord], metric: str, last: int = 7) -> list[float]:
    """A figure over the node's last `last` sweeps that had it, oldest first."""
    return [r.metrics[metric] for r in records if metric in r.metrics][-last:]
