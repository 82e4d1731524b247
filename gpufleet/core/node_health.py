"""How a node's health shows in the Kubernetes API: one vocabulary for the platform that sets it
(gpufleet.infra: node-problem-detector running the generated check, NVSentinel), the Kubernetes
sandbox's remediation stand-in that acts on it (gpufleet.sandbox.kube.remediation) and the chaos
backend that surfaces a fault on a simulated node the same way (gpufleet.chaos.backends.kubernetes).

- The node condition node-problem-detector sets from gpufleet's node-health check
  (infra.self_healing: a `permanent` custom-plugin rule): type CONDITION, status True with reason
  PROBLEM_REASON and the check's one-line message when the check fails, False with HEALTHY_REASON
  when it passes. The messages are the check's own (infra.npd_check renders them in shell; a unit
  test holds the two equal): `PROBLEM: XID 79 on GPU 0000:3b:00 (action isolates the node)`,
  `PROBLEM: fabric port(s) not ACTIVE: mlx5_0/1`.
- The taints that take a node out of scheduling: the node lifecycle controller's
  (`node.kubernetes.io/unreachable`, `not-ready`, `unschedulable`), the out-of-service taint of
  Kubernetes' non-graceful node shutdown (`node.kubernetes.io/out-of-service`, Kubernetes docs "Node
  Shutdowns": pods on a node with it are force-deleted by the pod GC so their controllers replace
  them) and the platform's quarantine taint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The XIDs NVIDIA's Kubernetes device plugin skips as application errors ("the GPU should still be
# healthy"). Any other XID makes it mark the GPU Unhealthy, which takes the GPU out of the node's
# allocatable (not its capacity) for good, until the plugin restarts (k8s-device-plugin v0.17.4:
# internal/rm/health.go `ignoredXids`; internal/plugin/server.go, "FIXME: there is no way to recover
# from the Unhealthy state").
NVIDIA_DEVICE_PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

CONDITION = "GpuFleetProblem"  # node-problem-detector's condition type (infra.self_healing)
PROBLEM_REASON = "GpuFleetCheckFailed"  # the custom-plugin rule's reason when the check fails
HEALTHY_REASON = "GpuFleetHealthy"  # the condition's default reason (the check passes)
HEALTHY_MESSAGE = "gpufleet node-health checks pass"

# The platform's quarantine (NVSentinel's fault-quarantine cordons; the sandbox's stand-in also
# taints, so a pod that tolerates cordons still stays away): value = the catalog fault.
QUARANTINE_TAINT = "gpufleet.io/quarantine"
# On a node the remediation quarantined: what it did (JSON), so it undoes only its own work.
QUARANTINE_ANNOTATION = "gpufleet.io/quarantined"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_VALUE = "nodeshutdown"  # the value the Kubernetes docs use
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# Taints that keep new pods off a node (any effect but PreferNoSchedule): a node carrying one is
# isolated, whatever else it says. Other NoSchedule taints (the GPU taint every GPU node has, a
# pool's own) are tolerated by the pods meant for the node and isolate nothing.
ISOLATING_TAINTS = frozenset(
    {UNREACHABLE_TAINT, NOT_READY_TAINT, UNSCHEDULABLE_TAINT, OUT_OF_SERVICE_TAINT, QUARANTINE_TAINT}
)


def xid_problem_message(xid: int, pci: str) -> str:
    """The check's message for an isolating XID in the kernel log (infra.npd_check's `say`)."""
    return f"PROBLEM: XID {xid} on GPU {pci} (action isolates the node)"


def fabric_problem_message(ports: list[str]) -> str:
    """The check's message for fabric ports that are not ACTIVE (`<hca>/<port>` each)."""
    return "PROBLEM: fabric port(s) not ACTIVE:" + "".join(f" {p}" for p in ports)


@dataclass(frozen=True)
class CheckProblem:
    """What a failing check's message names: an XID, fabric ports, or neither (unrecognised)."""

    xid: int | None = None
    fabric_ports: tuple[str, ...] = ()


_XID = re.compile(r"^PROBLEM: XID (\d+) on GPU ")
_FABRIC = re.compile(r"^PROBLEM: fabric port\(s\) not ACTIVE:(.*)$")


def parse_problem(message: str) -> CheckProblem:
    """The problem a condition's message names (pure; the messages above, read back)."""
    m = _XID.match(message)
    if m:
        return CheckProblem(xid=int(m.group(1)))
    m = _FABRIC.match(message)
    if m:
        return CheckProblem(fabric_ports=tuple(m.group(1).split()))
    return CheckProblem()
