"""Batch scheduling: Volcano (Queues + HyperNode network topology), Kueue (ResourceFlavors,
ClusterQueues, LocalQueues, a Topology for topology-aware scheduling), or Slurm on Kubernetes
through Slinky (slurm-operator + slurm charts).

Volcano: `scheduling.volcano.sh/v1beta1` Queue (weight, capability); `topology.volcano.sh/v1alpha1`
HyperNode (tier 1 = the nodes behind one leaf group, tier 2 = the pool) with `exactMatch` members.
Kueue: `kueue.x-k8s.io/v1beta1` ResourceFlavor/ClusterQueue/LocalQueue, `waitForPodsReady` so a
gang that cannot start is requeued instead of holding GPUs; `v1alpha1` Topology levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config import NodePool, SchedulerKind, accelerator_spec
from gpufleet.config.model import Queue, SchedulerSpec
from gpufleet.infra.charts import CHARTS, helm_release
from gpufleet.infra.common import MANAGED_BY, child
from gpufleet.infra.placement import (
    HYPERNODE_LABEL,
    LEAF_LABEL,
    POOL_LABEL,
    RACK_LABEL,
    leaf_groups,
    owns_nodes,
    pool_taints,
)

QUEUE_NAMESPACE = "default"  # where Kueue LocalQueues are offered to jobs
TOPOLOGY_NAME = "gpufleet"


@dataclass(frozen=True)
class SchedulerArgs:
    scheduler: SchedulerSpec
    pools: list[NodePool]


def gpu_resource(pools: list[NodePool]) -> str:
    """The extended resource that queue quotas are counted in: the one of the largest pool."""
    largest = max(pools, key=lambda p: p.total_gpus)
    return accelerator_spec(largest.accelerator).resource_name


def volcano_queue_spec(queue: Queue, resource: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": queue.weight, "reclaimable": True}
    if queue.gpu_quota is not None:
        spec["capability"] = {resource: str(queue.gpu_quota)}
    return spec


def hypernodes(pools: list[NodePool]) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """(name, tier, members) of the HyperNode tree: a tier-1 HyperNode per leaf group listing its
    nodes, a tier-2 HyperNode per pool listing its leaf groups. Only pools whose nodes are named
    (static/sandbox); Karpenter nodes appear at run time and are left to Volcano's discovery."""
    out: list[tuple[str, int, list[dict[str, Any]]]] = []
    for pool in pools:
        if not owns_nodes(pool):
            continue
        groups = leaf_groups(pool)
        for leaf, nodes in groups.items():
            out.append((leaf, 1, [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]))
        out.append(
            (
                pool.name,
                2,
                [{"type": "HyperNode", "selector": {"exactMatch": {"name": leaf}}} for leaf in groups],
            )
        )
    return out


def resource_flavor_spec(pool: NodePool, topology: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeLabels": {POOL_LABEL: pool.name},
        "tolerations": [t.toleration() for t in pool_taints(pool)],
    }
    if topology:
        spec["topologyName"] = TOPOLOGY_NAME
    return spec


def cluster_queue_spec(queue: Queue, pools: list[NodePool]) -> dict[str, Any]:
    """One resource group per GPU resource name; each pool is a flavor of it. Without a quota the
    queue may use the whole pool."""
    by_resource: dict[str, list[NodePool]] = {}
    for p in pools:
        by_resource.setdefault(accelerator_spec(p.accelerator).resource_name, []).append(p)
    groups = []
    for resource, members in sorted(by_resource.items()):
        flavors = []
        for p in members:
            quota = queue.gpu_quota if queue.gpu_quota is not None else p.total_gpus
            flavors.append({"name": p.name, "resources": [{"name": resource, "nominalQuota": quota}]})
        groups.append({"coveredResources": [resource], "flavors": flavors})
    return {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO", "resourceGroups": groups}


def slurm_values(spec: SchedulerSpec, pools: list[NodePool]) -> dict[str, Any]:
    """Slinky `slurm` chart values: a NodeSet per pool on that pool's nodes, a partition per queue."""
    nodesets = [
        {
            "name": p.name,
            "replicas": p.nodes,
            "nodeSelector": {POOL_LABEL: p.name},
            "tolerations": [t.toleration() for t in pool_taints(p)],
            "resources": {"limits": {accelerator_spec(p.accelerator).resource_name: p.gpus_per_node}},
        }
        for p in pools
    ]
    partitions = [
        {"name": q.name, "nodesets": [p.name for p in pools], "config": "State=UP"} for q in spec.queues
    ]
    return {"compute": {"nodesets": nodesets, "partitions": partitions}}


class Scheduler(pulumi.ComponentResource):
    def __init__(self, name: str, args: SchedulerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:scheduler:Scheduler", name, None, opts)
        spec, pools = args.scheduler, args.pools
        if spec.kind is SchedulerKind.VOLCANO:
            self.release = helm_release(
                f"{name}-volcano", "volcano", {"custom": {"scheduler_log_level": 2}}, self
            )
            resource = gpu_resource(pools)
            for q in spec.queues:
                k8s.apiextensions.CustomResource(
                    f"{name}-queue-{q.name}",
                    api_version="scheduling.volcano.sh/v1beta1",
                    kind="Queue",
                    metadata={"name": q.name, "labels": MANAGED_BY},
                    spec=volcano_queue_spec(q, resource),
                    opts=child(self, [self.release]),
                )
            for hn, tier, members in hypernodes(pools):
                k8s.apiextensions.CustomResource(
                    f"{name}-hypernode-{hn}",
                    api_version="topology.volcano.sh/v1alpha1",
                    kind="HyperNode",
                    metadata={"name": hn, "labels": MANAGED_BY},
                    spec={"tier": tier, "members": members},
                    opts=child(self, [self.release]),
                )
        elif spec.kind is SchedulerKind.KUEUE:
            self.release = helm_release(
                f"{name}-kueue",
                "kueue",
                {
                    "managerConfig": {
                        "controllerManagerConfigYaml": "waitForPodsReady:\n  enable: true\n"
                        "  timeout: 10m\n  blockAdmission: true\n"
                    }
                },
                self,
            )
            topology = any(owns_nodes(p) for p in pools)
            if topology:
                k8s.apiextensions.CustomResource(
                    f"{name}-topology",
                    api_version="kueue.x-k8s.io/v1alpha1",
                    kind="Topology",
                    metadata={"name": TOPOLOGY_NAME, "labels": MANAGED_BY},
                    spec={
                        "levels": [
                            {"nodeLabel": HYPERNODE_LABEL},
                            {"nodeLabel": LEAF_LABEL},
                            {"nodeLabel": RACK_LABEL},
                            {"nodeLabel": "kubernetes.io/hostname"},
                        ]
                    },
                    opts=child(self, [self.release]),
                )
            for p in pools:
                k8s.apiextensions.CustomResource(
                    f"{name}-flavor-{p.name}",
                    api_version="kueue.x-k8s.io/v1beta1",
                    kind="ResourceFlavor",
                    metadata={"name": p.name, "labels": MANAGED_BY},
                    spec=resource_flavor_spec(p, topology and owns_nodes(p)),
                    opts=child(self, [self.release]),
                )
            for q in spec.queues:
                cq = k8s.apiextensions.CustomResource(
                    f"{name}-clusterqueue-{q.name}",
                    api_version="kueue.x-k8s.io/v1beta1",
                    kind="ClusterQueue",
                    metadata={"name": q.name, "labels": MANAGED_BY},
                    spec=cluster_queue_spec(q, pools),
                    opts=child(self, [self.release]),
                )
                k8s.apiextensions.CustomResource(
                    f"{name}-localqueue-{q.name}",
                    api_version="kueue.x-k8s.io/v1beta1",
                    kind="LocalQueue",
                    metadata={"name": q.name, "namespace": QUEUE_NAMESPACE, "labels": MANAGED_BY},
                    spec={"clusterQueue": q.name},
                    opts=child(self, [cq]),
                )
        else:
            self.operator = helm_release(f"{name}-slurm-operator", "slurm-operator", {}, self)
            self.release = helm_release(
                f"{name}-slurm", "slurm", slurm_values(spec, pools), self, [self.operator]
            )
        self.kind = spec.kind.value
        self.register_outputs(
            {
                "kind": self.kind,
                "queues": [q.name for q in spec.queues],
                "namespace": CHARTS[self.kind if self.kind != "slurm" else "slurm"].namespace,
            }
        )
