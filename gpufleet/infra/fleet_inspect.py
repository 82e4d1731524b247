"""Fleet inspection on a Kubernetes cluster: every NVIDIA GPU node inspects itself, and one sweep reads
them all (docs/fleet-inspect.md, "On Kubernetes").

A DaemonSet per NVIDIA pool runs `gpufleet inspect --here --publish --pool <pool>` on each node of
the pool every PUBLISH_INTERVAL_S: nvidia-smi, the kernel log and the HCA ports of the node it runs
on, written as a ConfigMap in the inspect namespace (gpufleet.core.inspect_contract). `gpufleet
inspect --kubernetes` then judges the whole cluster with the same checks, history and lemon rules.

What the pods need, and why:
- the host's view: `hostNetwork` (the node's netdevs and RoCE/IB ports in sysfs), `privileged` for
  `dmesg` (the kernel log is CAP_SYSLOG's; node-problem-detector's own DaemonSet is privileged for
  the same reason);
- nvidia-smi without taking a GPU: the `nvidia` runtime class and NVIDIA_VISIBLE_DEVICES=all with the
  `utility` capability, which has the NVIDIA Container Toolkit mount nvidia-smi and NVML into the
  container (its documentation: "utility: required for using nvidia-smi and NVML"), as the GPU
  Operator runs dcgm-exporter; no `nvidia.com/gpu` request, so no GPU is withheld from jobs;
- NODE_NAME from the downward API: the pod's hostname is not the node's; POD_NAME, which `--publish`
  puts on the ConfigMap (the upgrade gate's proof that a reading is a new pod's);
- the stack: a copy with its secrets redacted (the game-day's `stack_document`), in gpufleet-system
  where the pods run; their ServiceAccount may create and update ConfigMaps in the inspect namespace
  and nothing else (`publisher_rules`), and an admission policy narrows that to the ConfigMap of the
  node its pod runs on (`own_node_policy`, ADR 0077: the pod's token names its node).

`pulumi up` does not wait for its pods (`pulumi.com/skipAwait`): they need the `nvidia` RuntimeClass,
which the GPU Operator creates once its toolkit runs on the nodes, after the program's first `up`
(and never on a stack whose charts are disabled, as the e2e deployment to the sandbox runs it: the
DaemonSet is declared and read back, and its pods are refused until the class exists). The DaemonSet
controller creates them as soon as it does.

AMD and Ascend pools get none: amd-smi and npu-smi are not in the gpufleet image (`--here` reads
them where they are installed; docs say so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config import NodePool, StackSpec, Vendor, accelerator_spec
from gpufleet.config.placement import POOL_LABEL
from gpufleet.core.inspect_contract import (
    INSPECT_NAMESPACE,
    POD_NAME_ENV,
    PUBLISH_INTERVAL_S,
    PUBLISHER_APP_LABEL,
    PUBLISHER_NAMESPACE,
    PUBLISHER_SERVICE_ACCOUNT,
    own_node_policy,
    publisher_rules,
)
from gpufleet.infra.common import MANAGED_BY, child
from gpufleet.infra.gameday import WORKDIR, stack_document

STACK_CONFIGMAP = "gpufleet-inspect-stack"
RUNTIME_CLASS = "nvidia"  # the GPU Operator's runtime class (its `operator.runtimeClass` default)


@dataclass(frozen=True)
class FleetInspectArgs:
    spec: StackSpec
    stack_name: str
    tolerations: list[dict[str, str]]
    system_namespace: pulumi.Input[str]  # PUBLISHER_NAMESPACE, as the platform's Namespace resource names it


def inspected_pools(spec: StackSpec) -> list[NodePool]:
    """The pools whose nodes publish: NVIDIA's (the image carries no amd-smi or npu-smi)."""
    return [p for p in spec.node_pools if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA]


def publish_loop(stack_name: str, pool: str) -> list[str]:
    """The container's command: inspect and publish, then wait; a failed run is printed and the next
    one comes (the sweep reads a node that stops publishing as UNKNOWN after three intervals)."""
    run = (f"gpufleet inspect --here --publish --stack {stack_name} --pool {pool} --no-record "
           "--format npd")
    return ["/bin/sh", "-c", f"while :; do {run}; sleep {PUBLISH_INTERVAL_S}; done"]


def daemonset_name(pool: NodePool) -> str:
    return f"gpufleet-inspect-{pool.name}"


def daemonset_spec(pool: NodePool, stack_name: str, image: str,
                   tolerations: list[dict[str, str]]) -> dict[str, Any]:
    key, app = PUBLISHER_APP_LABEL
    labels = {key: app, POOL_LABEL: pool.name}
    return {
        "selector": {"matchLabels": labels},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": PUBLISHER_SERVICE_ACCOUNT,
                "nodeSelector": {POOL_LABEL: pool.name},
                "tolerations": tolerations,
                "hostNetwork": True,
                "dnsPolicy": "ClusterFirstWithHostNet",  # the API server by its service name
                "runtimeClassName": RUNTIME_CLASS,
                "priorityClassName": "system-node-critical",
                "containers": [{
                    "name": "inspect",
                    "image": image,
                    "workingDir": WORKDIR,
                    "command": publish_loop(stack_name, pool.name),
                    "env": [
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                    ],
                    "securityContext": {"privileged": True},
                    "resources": {"requests": {"cpu": "10m", "memory": "128Mi"},
                                  "limits": {"memory": "512Mi"}},
                    "volumeMounts": [{"name": "stack", "mountPath": f"{WORKDIR}/stacks", "readOnly": True}],
                }],
                "volumes": [{"name": "stack", "configMap": {"name": STACK_CONFIGMAP}}],
            },
        },
    }


class FleetInspect(pulumi.ComponentResource):
    def __init__(self, name: str, args: FleetInspectArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:inspect:FleetInspect", name, None, opts)
        pools = inspected_pools(args.spec)
        ns = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": INSPECT_NAMESPACE, "labels": MANAGED_BY}, opts=child(self))
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata={"name": PUBLISHER_SERVICE_ACCOUNT, "namespace": args.system_namespace,
                      "labels": MANAGED_BY},
            opts=child(self))
        role = k8s.rbac.v1.Role(
            f"{name}-role",
            metadata={"name": PUBLISHER_SERVICE_ACCOUNT, "namespace": INSPECT_NAMESPACE,
                      "labels": MANAGED_BY},
            rules=publisher_rules(), opts=child(self, [ns]))
        k8s.rbac.v1.RoleBinding(
            f"{name}-binding",
            metadata={"name": PUBLISHER_SERVICE_ACCOUNT, "namespace": INSPECT_NAMESPACE,
                      "labels": MANAGED_BY},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                      "name": PUBLISHER_SERVICE_ACCOUNT},
            subjects=[{"kind": "ServiceAccount", "name": PUBLISHER_SERVICE_ACCOUNT,
                       "namespace": PUBLISHER_NAMESPACE}],
            opts=child(self, [role, sa]))
        policy, binding = own_node_policy()
        vap = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-own-node", metadata={**policy["metadata"], "labels": MANAGED_BY}, spec=policy["spec"],
            opts=child(self))
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-own-node-binding", metadata={**binding["metadata"], "labels": MANAGED_BY},
            spec=binding["spec"], opts=child(self, [vap]))
        stack = k8s.core.v1.ConfigMap(
            f"{name}-stack",
            metadata={"name": STACK_CONFIGMAP, "namespace": args.system_namespace, "labels": MANAGED_BY},
            data={f"Pulumi.{args.stack_name}.yaml": stack_document(args.spec)},
            opts=child(self))
        self.daemonsets = [
            k8s.apps.v1.DaemonSet(
                f"{name}-{p.name}",
                metadata={"name": daemonset_name(p), "namespace": args.system_namespace,
                          # The app label: how the upgrade gate finds the publisher (kube_driver).
                          "labels": {**MANAGED_BY, PUBLISHER_APP_LABEL[0]: PUBLISHER_APP_LABEL[1]},
                          "annotations": {"pulumi.com/skipAwait": "true"}},
                spec=daemonset_spec(p, args.stack_name, args.spec.gameday.image, args.tolerations),
                opts=child(self, [sa, stack]))
            for p in pools
        ]
        self.register_outputs({"pools": [p.name for p in pools], "namespace": INSPECT_NAMESPACE})
