"""Batch scheduling: Volcano (Queues + HyperNode network topology), Kueue (ResourceFlavors,
ClusterQueues, LocalQueues, a Topology for topology-aware scheduling), or Slurm on Kubernetes
through Slinky (slurm-operator + slurm charts).

Volcano: `scheduling.volcano.sh/v1beta1` Queue (weight, capability); `topology.volcano.sh/v1alpha1`
HyperNode (tier 1 = the nodes behind one leaf group, tier 2 = the pool) with `exactMatch` members.
Kueue: `kueue.x-k8s.io/v1beta1` ResourceFlavor/ClusterQueue/LocalQueue, `waitForPodsReady` so a
gang that cannot start is requeued instead of holding GPUs; `v1alpha1` Topology levels.

Facts read at the pinned versions (ADR 0021):
- Kueue v0.12.3: a pod request for a resource no resource group covers is refused ("resource %s
  unavailable in ClusterQueue", pkg/scheduler/flavorassigner/flavorassigner.go); resources whose
  name starts with a `resources.excludeResourcePrefixes` entry are dropped from a workload first
  (pkg/workload/workload.go dropExcludedResources). `managerConfig.controllerManagerConfigYaml`
  replaces the chart's whole Configuration (charts/kueue/values.yaml), so it is written out in full
  here, job integrations included. TopologyAwareScheduling is alpha and off by default
  (pkg/features/kube_features.go), switched on through `controllerManager.featureGates`.
- Volcano v1.12.1: the chart's default scheduler configuration
  (installer/helm/chart/volcano/config/volcano-scheduler.conf) has no `network-topology-aware`
  plugin, without which HyperNodes do nothing; `custom.scheduler_config_override` replaces it.
- Slinky slurm 0.3.0: a NodeSet renders only when `enabled` (templates/compute/compute-nodeset.yaml)
  and a partition line only when `enabled` and given nodesets, its `config` a map
  (templates/controller/slurm-configmap.yaml); accounting (slurmdbd + MariaDB) and slurm-exporter
  are on by default (values.yaml) and are decided explicitly here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from gpufleet.config import NodePool, SchedulerKind, accelerator_spec
from gpufleet.config.model import Queue, SchedulerSpec
from gpufleet.config.placement import (
    LEAF_LABEL,
    POOL_LABEL,
    RACK_LABEL,
    leaf_groups,
    owns_nodes,
    pool_taints,
)
from gpufleet.infra.charts import CHARTS, chart_install, custom_resource
from gpufleet.infra.common import MANAGED_BY, child

QUEUE_NAMESPACE = "default"  # where Kueue LocalQueues are offered to jobs
TOPOLOGY_NAME = "gpufleet"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# What Kueue does not count: CPU, memory and the fabric's device resources are not what the
# queues ration (GPUs are), and requests for them would otherwise need a quota in every flavor.
KUEUE_EXCLUDED_PREFIXES = (
    "cpu",
    "memory",
    "ephemeral-storage",
    "hugepages-",
    "rdma/",
    "nvidia.com/hostdev",
    "vpc.amazonaws.com/efa",
)
# Job kinds Kueue admits: the chart's default list at v0.12.3, which a managerConfig must repeat.
KUEUE_FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/mpijob",
    "ray.io/rayjob",
    "ray.io/raycluster",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/paddlejob",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/xgboostjob",
    "kubeflow.org/jaxjob",
    "workload.codeflare.dev/appwrapper",
)


def kueue_configuration() -> dict[str, Any]:
    """The whole Kueue Configuration: the chart's defaults (health, metrics, webhook, leader
    election, concurrency, client QPS, integrations) plus gang readiness and resource exclusions."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 5,
                "LocalQueue.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 1,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "waitForPodsReady": {"enable": True, "timeout": "10m", "blockAdmission": True},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        "resources": {"excludeResourcePrefixes": list(KUEUE_EXCLUDED_PREFIXES)},
    }


def kueue_values(topology: bool) -> dict[str, Any]:
    values: dict[str, Any] = {
        "managerConfig": {
            "controllerManagerConfigYaml": yaml.safe_dump(kueue_configuration(), sort_keys=False)
        }
    }
    if topology:
        values["controllerManager"] = {"featureGates": [{"name": "TopologyAwareScheduling", "enabled": True}]}
    return values


def kueue_excluded(resource: str) -> bool:
    return any(resource.startswith(p) for p in KUEUE_EXCLUDED_PREFIXES)


# Volcano's default scheduler configuration at v1.12.1 with the network-topology-aware plugin added.
VOLCANO_SCHEDULER_CONF: dict[str, Any] = {
    "actions": "enqueue, allocate, backfill",
    "tiers": [
        {
            "plugins": [
                {"name": "priority"},
                {"name": "gang", "enablePreemptable": False},
                {"name": "conformance"},
            ]
        },
        {
            "plugins": [
                {"name": "overcommit"},
                {"name": "drf", "enablePreemptable": False},
                {"name": "predicates"},
                {"name": "proportion"},
                {"name": "nodeorder"},
                {"name": "binpack"},
                {"name": "network-topology-aware"},
            ]
        },
    ],
}


def volcano_values() -> dict[str, Any]:
    return {
        "custom": {
            "scheduler_log_level": 2,
            "scheduler_config_override": yaml.safe_dump(VOLCANO_SCHEDULER_CONF, sort_keys=False),
        }
    }


@dataclass(frozen=True)
class SchedulerArgs:
    scheduler: SchedulerSpec
    pools: list[NodePool]
    depends_on: tuple[pulumi.Resource, ...] = ()  # cert-manager (Slinky's webhook certificate)


def gpu_resource(pools: list[NodePool]) -> str:
    """The extended resource that queue quotas are counted in: the one of the largest pool."""
    largest = max(pools, key=lambda p: p.total_gpus)
    return accelerator_spec(largest.accelerator).resource_name


def object_name(meta: Any) -> str:
    """metadata.name of a declared object, whether the engine hands back a dict or ObjectMeta."""
    return str(meta["name"] if isinstance(meta, dict) else meta.name)


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


def flavor_options(opts: pulumi.ResourceOptions, with_topology: bool) -> pulumi.ResourceOptions:
    """A ResourceFlavor with a topologyName is immutable as a whole (Kueue v0.12.3's CRD:
    `!has(oldSelf.topologyName) || self == oldSelf`, "resourceFlavorSpec are immutable when
    topologyName is set"), so a changed pool (taints, name) replaces it; delete first, because the
    replacement has the same name and a server-side apply onto the old one is that same refused
    update."""
    if not with_topology:
        return opts
    return pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(replace_on_changes=["spec"], delete_before_replace=True)
    )


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
            "enabled": True,
            # One partition per queue below, not one per NodeSet.
            "partition": {"enabled": False},
        }
        for p in pools
    ]
    partitions = [
        {
            "name": q.name,
            "enabled": True,
            "nodesets": [p.name for p in pools],
            "config": {"State": "UP", "MaxTime": "UNLIMITED", **({"Default": "YES"} if i == 0 else {})},
        }
        for i, q in enumerate(spec.queues)
    ]
    return {
        "compute": {"nodesets": nodesets, "partitions": partitions},
        # No job accounting database to run and back up: gpufleet reads Slurm's live state.
        "accounting": {"enabled": False},
        "mariadb": {"enabled": False},
        # Slurm metrics for Prometheus, through slurmrestd (which stays on).
        "slurm-exporter": {"enabled": True},
    }


class Scheduler(pulumi.ComponentResource):
    def __init__(self, name: str, args: SchedulerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:scheduler:Scheduler", name, None, opts)
        spec, pools = args.scheduler, args.pools
        queue_objects: list[pulumi.Output[Any]] = []
        self.release: k8s.helm.v3.Release | None = None
        if spec.kind is SchedulerKind.VOLCANO:
            volcano = chart_install(f"{name}-volcano", "volcano", volcano_values(), self)
            self.release = volcano.release
            resource = gpu_resource(pools)
            for q in spec.queues:
                vq = custom_resource(
                    f"{name}-queue-{q.name}",
                    "scheduling.volcano.sh/v1beta1",
                    "Queue",
                    {"name": q.name, "labels": MANAGED_BY},
                    volcano_queue_spec(q, resource),
                    child(self, volcano.ready),
                )
                if vq is not None:
                    queue_objects.append(vq.metadata)
            for hn, tier, members in hypernodes(pools):
                custom_resource(
                    f"{name}-hypernode-{hn}",
                    "topology.volcano.sh/v1alpha1",
                    "HyperNode",
                    {"name": hn, "labels": MANAGED_BY},
                    {"tier": tier, "members": members},
                    child(self, volcano.ready),
                )
        elif spec.kind is SchedulerKind.KUEUE:
            topology = any(owns_nodes(p) for p in pools)
            kueue = chart_install(f"{name}-kueue", "kueue", kueue_values(topology), self)
            self.release = kueue.release
            flavor_deps: list[pulumi.Resource] = list(kueue.ready)
            if topology:
                topo = custom_resource(
                    f"{name}-topology",
                    "kueue.x-k8s.io/v1alpha1",
                    "Topology",
                    {"name": TOPOLOGY_NAME, "labels": MANAGED_BY},
                    {
                        "levels": [
                            {"nodeLabel": POOL_LABEL},
                            {"nodeLabel": LEAF_LABEL},
                            {"nodeLabel": RACK_LABEL},
                            {"nodeLabel": "kubernetes.io/hostname"},
                        ]
                    },
                    child(self, kueue.ready),
                )
                flavor_deps += [topo] if topo is not None else []
            flavors: list[pulumi.Resource] = []
            for p in pools:
                with_topology = topology and owns_nodes(p)
                flavor = custom_resource(
                    f"{name}-flavor-{p.name}",
                    "kueue.x-k8s.io/v1beta1",
                    "ResourceFlavor",
                    {"name": p.name, "labels": MANAGED_BY},
                    resource_flavor_spec(p, with_topology),
                    flavor_options(child(self, flavor_deps), with_topology),
                )
                flavors += [flavor] if flavor is not None else []
            for q in spec.queues:
                cq = custom_resource(
                    f"{name}-clusterqueue-{q.name}",
                    "kueue.x-k8s.io/v1beta1",
                    "ClusterQueue",
                    {"name": q.name, "labels": MANAGED_BY},
                    cluster_queue_spec(q, pools),
                    child(self, [*kueue.ready, *flavors]),  # it names the flavors
                )
                lq = custom_resource(
                    f"{name}-localqueue-{q.name}",
                    "kueue.x-k8s.io/v1beta1",
                    "LocalQueue",
                    {"name": q.name, "namespace": QUEUE_NAMESPACE, "labels": MANAGED_BY},
                    {"clusterQueue": q.name},
                    child(self, [cq] if cq is not None else kueue.ready),
                )
                if lq is not None:
                    queue_objects.append(lq.metadata)
        else:
            operator = chart_install(
                f"{name}-slurm-operator", "slurm-operator", {}, self, list(args.depends_on)
            )
            self.operator = operator.release
            self.release = chart_install(
                f"{name}-slurm", "slurm", slurm_values(spec, pools), self, operator.ready
            ).release
        self.kind = spec.kind.value
        if queue_objects:
            self.queue_names: pulumi.Output[list[str]] = pulumi.Output.all(*queue_objects).apply(
                lambda ms: [object_name(m) for m in ms]
            )
        elif self.release is not None and spec.kind is SchedulerKind.SLURM:
            # Slurm: the partitions the slurm release renders
            self.queue_names = self.release.values.apply(
                lambda v: [str(p["name"]) for p in v["compute"]["partitions"]]
            )
        else:  # nothing declared that serves a queue (charts off, or the kinds not served)
            self.queue_names = pulumi.Output.from_input([])
        self.register_outputs(
            {
                "kind": self.kind,
                "queues": [q.name for q in spec.queues],
                "namespace": CHARTS[self.kind if self.kind != "slurm" else "slurm"].namespace,
            }
        )
