"""Rolling driver and firmware upgrades: a pure planner (canary, then waves) and a pure rollout
state machine (next actions from observed events), docs/fleet-upgrade.md."""

from gpufleet.core.maintenance import under_upgrade
from gpufleet.fleet.upgrade.model import (
    Component,
    FleetSnapshot,
    Job,
    NodeObservation,
    RolloutPolicy,
    protection,
    with_protection,
)
from gpufleet.fleet.upgrade.plan import LeftOut, SkipReason, UpgradePlan, Wave, plan_upgrade
from gpufleet.fleet.upgrade.rollout import (
    Action,
    Cordon,
    Event,
    Evict,
    GateResult,
    Hold,
    JobEnded,
    JobStarted,
    NodeUnhealthy,
    Phase,
    Reboot,
    RebootDone,
    Rollout,
    RolloutError,
    RunGate,
    Tick,
    Uncordon,
)
from gpufleet.fleet.upgrade.snapshot import load_snapshot, snapshot_from_stack

__all__ = [
    "Action",
    "Component",
    "Cordon",
    "Event",
    "Evict",
    "FleetSnapshot",
    "GateResult",
    "Hold",
    "Job",
    "JobEnded",
    "JobStarted",
    "LeftOut",
    "NodeObservation",
    "NodeUnhealthy",
    "Phase",
    "Reboot",
    "RebootDone",
    "Rollout",
    "RolloutError",
    "RolloutPolicy",
    "RunGate",
    "SkipReason",
    "Tick",
    "Uncordon",
    "UpgradePlan",
    "Wave",
    "load_snapshot",
    "plan_upgrade",
    "protection",
    "snapshot_from_stack",
    "under_upgrade",
    "with_protection",
]
