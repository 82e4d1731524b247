"""The NVIDIA GPU Operator's driver upgrade policy (ClusterPolicy `spec.driver.upgradePolicy`) as the
stack's `gpufleet:upgrade` section sets it: one decision shared by the Pulumi program, which
declares the ClusterPolicy, and the Kubernetes sandbox, which runs the operator's upgrade controller.

Field names and meanings are the operator's (api/nvidia/v1 DriverUpgradePolicySpec, k8s-operator-libs
api/upgrade/v1alpha1: DrainSpec, PodDeletionSpec, WaitForCompletionSpec). Its upgrade controller
refuses to go past `pod-deletion-required` without a podDeletion section ("pod deletion spec should
not be empty", seen on the sandbox), which the chart's values.yaml carries but a ClusterPolicy
written without the chart must carry itself.
"""

from __future__ import annotations

from typing import Any

from gpufleet.config.accelerators import Vendor, accelerator_spec
from gpufleet.config.model import StackSpec, UpgradeSpec, share_of

# The driver when no NVIDIA pool pins one: data-center branch 570 is the default of GPU Operator
# v25.3 (its release notes), the operator the Pulumi program installs.
DEFAULT_DRIVER = "570.124.06"

# Node label and annotations of k8s-operator-libs pkg/upgrade (consts.go), with the driver name the
# GPU Operator gives it ("gpu").
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"  # "true": the controller leaves the node alone
# Set by the controller on a node that was cordoned before its upgrade began: it then does not
# uncordon the node at the end (the state goes straight to upgrade-done).
INITIAL_UNSCHEDULABLE_ANNOTATION = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
UPGRADE_DONE = "upgrade-done"
UPGRADE_REQUIRED = "upgrade-required"
UPGRADE_FAILED = "upgrade-failed"
# Kueue's label naming a pod's LocalQueue (protected jobs are named by queue in the stack).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def driver_upgrade_policy(spec: UpgradeSpec, gpu_nodes: int) -> dict[str, Any]:
    """`spec.driver.upgradePolicy` for a fleet of `gpu_nodes` NVIDIA nodes."""
    drain_s = int(spec.drain_timeout_seconds)
    policy: dict[str, Any] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": share_of(spec.wave_size, gpu_nodes),
        # An int or a percentage, as the stack writes it (intstr in the CRD).
        "maxUnavailable": spec.max_unavailable,
        "podDeletion": {"force": False, "timeoutSeconds": drain_s, "deleteEmptyDir": False},
        "drain": {"enable": True, "force": False, "timeoutSeconds": drain_s, "deleteEmptyDir": False},
    }
    if spec.protected_jobs.queues:
        # The controller waits (up to the timeout) for the pods of protected queues to end before it
        # deletes or drains anything; name patterns have no label selector form.
        queues = ",".join(sorted(spec.protected_jobs.queues))
        policy["waitForCompletion"] = {"podSelector": f"{KUEUE_QUEUE_LABEL} in ({queues})",
                                       "timeoutSeconds": int(spec.protected_job_wait_seconds)}
    return policy


def pinned_driver(spec: StackSpec) -> str:
    """The driver every NVIDIA node runs: the pools' pin (the stack model holds them equal: one
    ClusterPolicy drives them all), else DEFAULT_DRIVER."""
    pins = [p.software.driver for p in spec.node_pools
            if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA and p.software.driver]
    return pins[0] if pins else DEFAULT_DRIVER
