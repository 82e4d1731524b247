"""Node fault actions. Every one is guarded by the blast-radius limit (gameday.maxNodesDown and the
last spare) and written to the fault ledger before it is applied."""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import InvalidActivity
from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import NodeCrash, NodeHang, NodeReboot
from gpufleet.chaos import engine
from gpufleet.chaos.backends.base import Backend

__all__ = [
    "cordon_node", "crash_node", "evict_pod", "hang_node", "inject_node_fault", "reboot_node", "restore_node",
    "taint_node",
]

NODE_KINDS = {"node-crash", "node-hang", "node-reboot", "cordon", "taint", "host-signal"}


def crash_node(
    node: str,
    fault_id: str = "node-crash",
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Crash `node`. Sandbox: SIGKILL every process in the node's network namespace (slurmd, the
    node agent, training ranks), after recording how to start its daemons again. Slurm: SIGKILL
    slurmd. Rollback (`restore_node`): restart the daemons and resume the node."""
    return engine.inject(configuration, NodeCrash(), fault_id, node, 0, allow_spare_exhaustion)


def hang_node(
    node: str,
    fault_id: str = "node-hang",
    allow_spare_exhaustion: bool = False,
    reboot_on_restore: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Freeze `node`: SIGSTOP every process in its namespace (sandbox) or slurmd (Slurm). The node
    stops answering as a hung kernel would. Rollback: SIGCONT the same processes (checked by start
    time, so a reused PID is never signalled) - the hang clears by itself; or, with
    `reboot_on_restore` (sandbox), what the remediation of a hung node does: kill the frozen
    processes and start the node's daemons again (a reboot)."""
    injection = NodeHang(reboot_on_restore=reboot_on_restore)
    return engine.inject(configuration, injection, fault_id, node, 0, allow_spare_exhaustion)


def reboot_node(
    node: str,
    down_seconds: float = 5.0,
    fault_id: str = "node-crash",
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Reboot `node`: kill its processes, keep it down for `down_seconds`, start its daemons again
    (the action returns when the node's daemons run again)."""
    injection = engine.build_injection(NodeReboot, down_seconds=down_seconds)  # 0..600 s
    return engine.inject(configuration, injection, fault_id, node, 0, allow_spare_exhaustion)


def inject_node_fault(
    fault_id: str,
    node: str,
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Inject the catalog node fault `fault_id` (power supply, CPU, memory, local disk, ...) on `node`
    with the catalog's injection method and parameters for the configured backend."""
    return engine.inject_catalog_fault(configuration, fault_id, node, 0, allow_spare_exhaustion)


def restore_node(
    node: str | None = None, configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Undo every node fault still in the ledger (on `node` only, if given): restart crashed
    daemons, continue frozen processes, uncordon, untaint."""
    return engine.revert_summary(engine.revert(configuration, NODE_KINDS, node))


def _k8s(b: Backend) -> Any:
    from gpufleet.chaos.backends.kubernetes import KubernetesBackend

    if not isinstance(b, KubernetesBackend):
        raise InvalidActivity("cordon_node, taint_node and evict_pod need gpufleet_backend kubernetes")
    return b


def cordon_node(
    node: str,
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Cordon a Kubernetes node (`spec.unschedulable: true`, strategic-merge patch). Rollback: uncordon."""
    return engine.run_plan(
        configuration, lambda b, n: _k8s(b).cordon(n), None, allow_spare_exhaustion, node=node
    )


def taint_node(
    node: str,
    key: str,
    value: str | None = None,
    effect: str = "NoSchedule",
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Add a taint to a Kubernetes node (read, add, patch `spec.taints`). Rollback: remove it."""
    return engine.run_plan(
        configuration,
        lambda b, n: _k8s(b).taint(n, key, value, effect),
        None,
        allow_spare_exhaustion,
        node=node,
    )


def evict_pod(
    pod: str,
    namespace: str,
    grace_seconds: int | None = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Evict a pod through the policy/v1 Eviction API (honours PodDisruptionBudgets)."""
    return engine.run_plan(configuration, lambda b: _k8s(b).evict(pod, namespace, grace_seconds), None)
