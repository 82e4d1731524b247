"""Who holds a node for maintenance: the mark a rolling upgrade puts in the node's drain reason
(Slurm) or label (Kubernetes), read by every actor that could act on the node. It lives here, below
the domains, because the writer (`gpufleet.fleet.upgrade`) and the readers (the node health check's
drain, remediation) are different domains (ADR 0057)."""

from __future__ import annotations

UPGRADE_MARK = "gpufleet-upgrade"
# On Kubernetes the reason is this node annotation (a cordon has no reason field of its own): written
# by the GPU Operator upgrade driver, read by the platform's remediation.
MAINTENANCE_ANNOTATION = "gpufleet.io/maintenance"


def upgrade_reason(rollout_id: str, component: str, target: str) -> str:
    """The reason of a node a rollout has taken: remediation stands aside while it holds."""
    return f"{UPGRADE_MARK} {rollout_id}: {component} -> {target}"


def held_reason(why: str) -> str:
    """The reason of a node a rollout gave up on and left drained: no longer under upgrade, so
    remediation and people may act on it."""
    return f"{UPGRADE_MARK}-failed: {why}"


def under_upgrade(reason: str | None) -> bool:
    """Whether a drain reason says that a rollout holds the node now."""
    return reason is not None and reason.startswith(f"{UPGRADE_MARK} ")


def held_by_rollout(reason: str | None) -> bool:
    """Whether a rollout put the node's drain reason there: it holds the node now (under upgrade) or
    gave up on it and left it drained with what went wrong. Either way the node is out of service
    with a reason naming the cause, and remediation's own drain would only overwrite that reason."""
    return reason is not None and (under_upgrade(reason) or reason.startswith(f"{UPGRADE_MARK}-failed: "))
