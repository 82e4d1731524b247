"""What a rolling upgrade reads: a fleet snapshot (nodes, their versions, cordons, jobs, health) and
the stack's upgrade policy resolved to node counts for that fleet.

The snapshot is the one format shared by whoever observes the fleet (the stack, a file, a live
backend) and the planner; it is validated at the edge like every user file (unknown keys rejected).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.config import UpgradeSpec, share_of


class Component(StrEnum):
    DRIVER = "driver"
    FIRMWARE = "firmware"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class Job(_Model):
    """A job running on a node. `protected` is decided by the stack's policy (`protection`)."""

    id: str
    name: str = ""
    queue: str = ""
    protected: bool = False


class NodeObservation(_Model):
    name: str
    pool: str
    # The version of the component being upgraded; None when the source cannot know it (a snapshot
    # built from the stack alone).
    version: str | None = None
    # Who cordoned (drained) the node, if anyone: a person, remediation, another rollout.
    cordoned_by: str | None = None
    healthy: bool = True
    jobs: list[Job] = Field(default_factory=list)

    def protected_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j.protected]


class FleetSnapshot(_Model):
    """The fleet as one source saw it. `source` says which, so a plan says what it did not know."""

    source: Literal["stack", "file", "live"]
    component: Component = Component.DRIVER
    nodes: list[NodeObservation] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> FleetSnapshot:
        dups = sorted(name for name, n in Counter(n.name for n in self.nodes).items() if n > 1)
        if dups:
            raise ValueError(f"node names repeat: {', '.join(dups[:10])}")
        return self


def protection(spec: UpgradeSpec, job: Job) -> bool:
    """Whether the stack's policy protects a job: its queue is listed or its name matches a pattern."""
    rules = spec.protected_jobs
    return job.queue in rules.queues or any(fnmatchcase(job.name, pat) for pat in rules.name_patterns)


def with_protection(snapshot: FleetSnapshot, spec: UpgradeSpec) -> FleetSnapshot:
    """The snapshot with every job the stack's policy protects flagged (a flag the source set stays)."""
    nodes = [
        n.model_copy(update={"jobs": [j.model_copy(update={"protected": j.protected or protection(spec, j)})
                                      for j in n.jobs]})
        if n.jobs else n
        for n in snapshot.nodes
    ]
    return snapshot.model_copy(update={"nodes": nodes})


@dataclass(frozen=True, slots=True)
class RolloutPolicy:
    """The stack's UpgradeSpec resolved to node counts for one fleet."""

    canary_nodes_per_pool: int
    wave_size: int
    max_unavailable: int
    bake_seconds: float
    protected_job_wait_seconds: float
    drain_timeout_seconds: float
    reboot_timeout_seconds: float
    gate_timeout_seconds: float

    @classmethod
    def resolve(cls, spec: UpgradeSpec, fleet_nodes: int) -> RolloutPolicy:
        return cls(
            canary_nodes_per_pool=spec.canary_nodes_per_pool,
            wave_size=share_of(spec.wave_size, fleet_nodes),
            max_unavailable=share_of(spec.max_unavailable, fleet_nodes),
            bake_seconds=spec.bake_seconds,
            protected_job_wait_seconds=spec.protected_job_wait_seconds,
            drain_timeout_seconds=spec.drain_timeout_seconds,
            reboot_timeout_seconds=spec.reboot_timeout_seconds,
            gate_timeout_seconds=spec.gate_timeout_seconds,
        )

    @property
    def taken_budget_seconds(self) -> float:
        """The longest a node may stay taken (cordoned by the rollout) before it is settled: drain,
        reboot to the target, gate, reboot back to the old version, gate again."""
        return self.drain_timeout_seconds + 2 * (self.reboot_timeout_seconds + self.gate_timeout_seconds)
