"""Which checks run where (pure): the light checks everywhere; the heavy (full) checks, which load
every GPU and link for minutes, only on nodes no job holds: idle or drained (Crusoe's "active health
checks" run on idle nodes at the lowest priority so jobs preempt them; SageMaker HyperPod's deep
health checks hold the node in a maintenance reservation; anchors-ops.md 3.1 C). Jobs take
precedence: a node that is allocated, mixed, draining (its jobs still run), down or of unknown
state gets the light checks only, with the reason.

Collective tests pair the eligible nodes even with odd ("pairwise-quick", facebookresearch/gcm's
check-nccl: each node in one pair), so a slow node shows in its pair's figure at a cost of one test
round, not the n^2 of all pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.fleet.inspect.observation import Level, SchedState

HEAVY_ALLOWED: frozenset[SchedState] = frozenset({"idle", "drained"})


@dataclass(frozen=True)
class NodePlan:
    node: str
    full: bool
    reason: str


@dataclass(frozen=True)
class SweepPlan:
    level: Level
    nodes: tuple[NodePlan, ...]
    pairs: tuple[tuple[str, str], ...]  # collective-test pairs among the nodes that run full checks
    unpaired: tuple[str, ...]  # an odd node out is tested against a node of the pair before it


def decide(state: SchedState, level: Level) -> tuple[bool, str]:
    """Whether this node runs the heavy checks, and why (or why not)."""
    if level == "light":
        return False, "light sweep"
    if state in HEAVY_ALLOWED:
        return True, f"{state}: no job holds it"
    return False, f"{state}: jobs take precedence, light checks only"


def pair_quick(nodes: Sequence[str]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Even-odd pairs in the given order; an odd count leaves the last node over."""
    pairs = tuple((nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2))
    rest = tuple(nodes[len(pairs) * 2:])
    return pairs, rest


def plan_sweep(states: Sequence[tuple[str, SchedState]], level: Level) -> SweepPlan:
    plans = []
    for node, state in states:
        full, why = decide(state, level)
        plans.append(NodePlan(node, full, why))
    eligible = [p.node for p in plans if p.full]
    pairs, rest = pair_quick(eligible)
    return SweepPlan(level, tuple(plans), pairs, rest)
