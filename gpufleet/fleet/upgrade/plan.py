"""The upgrade planner: a pure function of a fleet snapshot, the stack's policy and a target version.

Canary nodes first (per pool, the idlest nodes, so a protected job does not hold up the canary),
then waves of `waveSize` nodes in the snapshot's order. Nodes the rollout must not touch are left
out up front, each with its reason: cordoned by someone else (never ours to uncordon), unhealthy
(remediation owns it). Nodes already at the target are reported as up to date.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.config import UpgradeSpec
from gpufleet.fleet.upgrade.model import Component, FleetSnapshot, NodeObservation, RolloutPolicy


class SkipReason(StrEnum):
    CORDONED_BY_OTHER = "cordoned-by-other"
    UNHEALTHY = "unhealthy"
    PROTECTED_JOB = "protected-job-still-running"
    DRAIN_TIMEOUT = "drain-timed-out"
    PROTECTED_JOB_ON_CORDONED = "protected-job-started-on-cordoned-node"
    HALTED = "rollout-halted"
    NO_CANARY = "no-canary-of-the-pool-passed"


@dataclass(frozen=True, slots=True)
class Wave:
    index: int  # 0 is the canary
    nodes: tuple[str, ...]

    @property
    def canary(self) -> bool:
        return self.index == 0


@dataclass(frozen=True, slots=True)
class LeftOut:
    node: str
    reason: SkipReason
    detail: str


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    target: str
    component: Component
    source: str
    policy: RolloutPolicy
    waves: tuple[Wave, ...]
    left_out: tuple[LeftOut, ...]
    up_to_date: tuple[str, ...]
    unknown_version: int  # nodes whose current version the snapshot did not know

    @property
    def planned_nodes(self) -> int:
        return sum(len(w.nodes) for w in self.waves)

    def to_doc(self) -> dict[str, Any]:
        p = self.policy
        return {
            "target": self.target,
            "component": self.component.value,
            "source": self.source,
            "policy": {
                "canaryNodesPerPool": p.canary_nodes_per_pool,
                "waveSize": p.wave_size,
                "maxUnavailable": p.max_unavailable,
                "bakeSeconds": p.bake_seconds,
                "protectedJobWaitSeconds": p.protected_job_wait_seconds,
                "drainTimeoutSeconds": p.drain_timeout_seconds,
                "rebootTimeoutSeconds": p.reboot_timeout_seconds,
                "gateTimeoutSeconds": p.gate_timeout_seconds,
            },
            "waves": [{"index": w.index, "canary": w.canary, "nodes": list(w.nodes)} for w in self.waves],
            "leftOut": [
                {"node": s.node, "reason": s.reason.value, "detail": s.detail} for s in self.left_out
            ],
            "upToDate": list(self.up_to_date),
            "unknownVersion": self.unknown_version,
            "plannedNodes": self.planned_nodes,
        }


def _left_out(node: NodeObservation) -> LeftOut | None:
    if node.cordoned_by is not None:
        return LeftOut(node.name, SkipReason.CORDONED_BY_OTHER, f"cordoned by {node.cordoned_by}")
    if not node.healthy:
        return LeftOut(node.name, SkipReason.UNHEALTHY, "unhealthy: remediation owns it")
    return None


def _idleness(node: NodeObservation) -> tuple[int, int]:
    return (len(node.protected_jobs()), len(node.jobs))


def plan_upgrade(snapshot: FleetSnapshot, spec: UpgradeSpec, target: str) -> UpgradePlan:
    """Canary, then waves, over every node that needs the target and may be touched."""
    policy = RolloutPolicy.resolve(spec, len(snapshot.nodes))
    left_out: list[LeftOut] = []
    up_to_date: list[str] = []
    by_pool: dict[str, list[NodeObservation]] = {}
    for node in snapshot.nodes:
        if node.version == target:
            up_to_date.append(node.name)
            continue
        skip = _left_out(node)
        if skip is not None:
            left_out.append(skip)
            continue
        by_pool.setdefault(node.pool, []).append(node)
    canary: list[str] = []
    for nodes in by_pool.values():
        # sorted() is stable: among equally idle nodes the snapshot's order stands.
        canary += [n.name for n in sorted(nodes, key=_idleness)[: policy.canary_nodes_per_pool]]
    chosen = set(canary)
    rest = [n.name for nodes in by_pool.values() for n in nodes if n.name not in chosen]
    waves = [Wave(0, tuple(canary))] if canary else []
    for start in range(0, len(rest), policy.wave_size):
        waves.append(Wave(len(waves), tuple(rest[start : start + policy.wave_size])))
    return UpgradePlan(
        target=target,
        component=snapshot.component,
        source=snapshot.source,
        policy=policy,
        waves=tuple(waves),
        left_out=tuple(left_out),
        up_to_date=tuple(up_to_date),
        unknown_version=sum(1 for n in snapshot.nodes if n.version is None),
    )
