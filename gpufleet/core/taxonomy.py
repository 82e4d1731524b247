"""Names shared by the stack model (budgets per fault class), the catalog (each fault's class and
action) and the SLO maths. Kept here so those three stay independent of each other."""

from __future__ import annotations

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
