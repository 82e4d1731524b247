"""Names shared by the stack model (budgets per fault class), the catalog (each fault's class and
action) and the SLO maths. Kept here so those three stay independent of each other."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FaultClass(StrEnum):
    """Fault classes: the unit in which detection policy and recovery budgets are declared."""

    GPU_FATAL = "gpu-fatal"  # the GPU must be isolated (XID 48, 64, 79, 95, 119 ...)
    GPU_CONTAINED = "gpu-contained"  # the job restarts, the node stays (XID 13, 31, 94)
    GPU_DEGRADED = "gpu-degraded"  # warning-level health (thermal, row remap pending, SBE rate)
    NODE_CRASH = "node-crash"
    NODE_HANG = "node-hang"
    NODE_MAINTENANCE = "node-maintenance"
    FABRIC_LINK_DOWN = "fabric-link-down"
    FABRIC_FLAP = "fabric-flap"
    FABRIC_DEGRADED = "fabric-degraded"
    FABRIC_SWITCH_DOWN = "fabric-switch-down"
    STORAGE_OUTAGE = "storage-outage"
    STORAGE_DEGRADED = "storage-degraded"
    WORKLOAD = "workload"  # the job itself fails (a software bug, a killed rank); hardware is fine

    @property
    def isolates_node(self) -> bool | None:
        """True: the node leaves scheduling (drained, cordoned or DOWN); False: it must stay in
        service (isolating it loses capacity for nothing); None: either, depending on the fault."""
        return CLASS_TRAITS[self].isolates_node

    @property
    def interrupts_training(self) -> bool:
        """True: the training job stops and must restart; False: it may ride the fault through."""
        return CLASS_TRAITS[self].interrupts_training


@dataclass(frozen=True)
class ClassTraits:
    isolates_node: bool | None
    interrupts_training: bool


# The one table of what a fault class does to a node and to training (gpu-faults.md: a fatal XID
# needs the GPU isolated; a contained ECC error restarts the job and keeps the node; degraded links
# and storage are ridden through). The game-day's default expectations, the chaos blast-radius guard
# and the recovery floor all read it. Before issue 10 four tables said this and two disagreed
# (docs/adr/0031-one-judge.md): fabric-flap interrupts (the floor and the flap experiment said so,
# the game-day's default did not); fabric-switch-down and node-maintenance isolate (the guard and
# the game-day each missed one); a workload fault interrupts training and keeps the node.
CLASS_TRAITS: dict[FaultClass, ClassTraits] = {
    FaultClass.GPU_FATAL: ClassTraits(isolates_node=True, interrupts_training=True),
    FaultClass.GPU_CONTAINED: ClassTraits(isolates_node=False, interrupts_training=True),
    FaultClass.GPU_DEGRADED: ClassTraits(isolates_node=None, interrupts_training=False),
    FaultClass.NODE_CRASH: ClassTraits(isolates_node=True, interrupts_training=True),
    FaultClass.NODE_HANG: ClassTraits(isolates_node=True, interrupts_training=True),
    # A planned drain: the node leaves scheduling, running jobs finish first.
    FaultClass.NODE_MAINTENANCE: ClassTraits(isolates_node=True, interrupts_training=False),
    FaultClass.FABRIC_LINK_DOWN: ClassTraits(isolates_node=True, interrupts_training=True),
    # Collectives over a flapping link time out and the job restarts; whether the node is drained
    # depends on how long it flaps.
    FaultClass.FABRIC_FLAP: ClassTraits(isolates_node=None, interrupts_training=True),
    FaultClass.FABRIC_DEGRADED: ClassTraits(isolates_node=None, interrupts_training=False),
    FaultClass.FABRIC_SWITCH_DOWN: ClassTraits(isolates_node=True, interrupts_training=True),
    FaultClass.STORAGE_OUTAGE: ClassTraits(isolates_node=None, interrupts_training=False),
    FaultClass.STORAGE_DEGRADED: ClassTraits(isolates_node=None, interrupts_training=False),
    FaultClass.WORKLOAD: ClassTraits(isolates_node=False, interrupts_training=True),
}


class LadderAction(StrEnum):
    """The remediation ladder seen in production remediators, mildest first
    (gpu-faults.md: restart app -> reset GPU -> reboot node -> replace/RMA)."""

    NONE = "none"
    RESTART_JOB = "restart-job"
    RESET_GPU = "reset-gpu"
    REBOOT_NODE = "reboot-node"
    REPLACE = "replace"

    @property
    def rank(self) -> int:
        return list(LadderAction).index(self)

    @property
    def isolates_node(self) -> bool:
        """Actions from GPU reset upwards take the node out of scheduling first."""
        return self.rank >= LadderAction.RESET_GPU.rank


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
