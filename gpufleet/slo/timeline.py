"""A recovery timeline: what happened, when, according to which source.

Chaos probes build timelines from the fault ledger, Prometheus (alert firing), the scheduler (node
drained / returned) and the workload (first step after restart). `gpufleet.slo` turns them into
measured times and verdicts. Times are Unix seconds (floats).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class EventKind(StrEnum):
    INJECTED = "injected"  # the fault was applied (ledger)
    DETECTED = "detected"  # first alert firing / health check reporting it
    ISOLATED = "isolated"  # node drained / cordoned, or the faulty GPU fenced
    INTERRUPTED = "interrupted"  # the workload stopped making progress (last step before the stall)
    RESUMED = "resumed"  # the workload's first step after restart
    REVERTED = "reverted"  # the fault was undone (rollback)
    RETURNED = "returned"  # the node is schedulable again


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EventKind
    at: float
    source: str  # e.g. "ledger", "prometheus:GpuFallenOffBus", "slurm:gpu-2", "workload"
    node: str | None = None
    detail: str = ""


class Timeline(BaseModel):
    """Events of one fault injection (one experiment run), plus workload progress facts."""

    model_config = ConfigDict(extra="forbid")

    experiment: str
    fault_id: str  # catalog id of the injected fault
    fault_class: str  # gpufleet.core.FaultClass value
    window_start: float  # start of the observation window (before injection)
    window_end: float
    events: list[Event] = Field(default_factory=list)
    steps_at_fault: int | None = None  # last completed step before the fault
    checkpoint_step_at_fault: int | None = None  # newest valid checkpoint at the fault
    resumed_from_step: int | None = None  # checkpoint step the restarted job loaded
    nodes_total: int | None = None
    nodes_unavailable: dict[str, list[tuple[float, float | None]]] = Field(default_factory=dict)

    def first(self, kind: EventKind) -> Event | None:
        hits = sorted((e for e in self.events if e.kind is kind), key=lambda e: e.at)
        return hits[0] if hits else None
