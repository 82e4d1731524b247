"""The whole platform of one stack: every component, in dependency order, and the stack outputs.

`Platform` is what `infra/__main__.py` (under `pulumi preview/up`) and the offline preview (under
the mock runtime) both build from a validated StackSpec; neither passes anything else in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.catalog import XidRule, load_catalog, xid_policy
from gpufleet.catalog.dashboard import dashboard
from gpufleet.catalog.rules import RuleSettings, rule_groups
from gpufleet.config import (
    FabricMode,
    NodePool,
    SchedulerKind,
    StackSpec,
    Vendor,
    accelerator_spec,
    collective_environment,
)
from gpufleet.config.gpu_operator import pinned_driver
from gpufleet.config.model import CephSpec, DrSpec, JuiceFsSpec
from gpufleet.config.placement import pool_taints
from gpufleet.infra.backups import BACKUP_NAMESPACE, Backups, BackupsArgs
from gpufleet.infra.charts import CHARTS, ChartPlan, chart_plan, helm_release
from gpufleet.infra.common import MANAGED_BY, SYSTEM_NAMESPACE
from gpufleet.infra.fabric import (
    TRAINING_NAMESPACE,
    Fabric,
    FabricArgs,
    connectx_fabric,
    network_crs,
    rdma_resource,
)
from gpufleet.infra.fleet_inspect import FleetInspect, FleetInspectArgs
from gpufleet.infra.gameday import GamedayArgs, GamedaySchedule
from gpufleet.infra.gpu_software import AMD_EXPORTER_PORT, GpuSoftware, GpuSoftwareArgs
from gpufleet.infra.monitoring import Monitoring, MonitoringArgs, alert_count, rule_settings
from gpufleet.infra.nodepools import GpuNodePool, GpuNodePoolArgs
from gpufleet.infra.scheduler import QUEUE_LABEL, Scheduler, SchedulerArgs
from gpufleet.infra.self_healing import SelfHealing, SelfHealingArgs
from gpufleet.infra.storage import Storage, StorageArgs


@dataclass(frozen=True)
class PlatformArgs:
    spec: StackSpec
    stack_name: str  # the Pulumi stack (the game-day CronJob passes it to `gpufleet gameday`)
    kube_context: str | None = None  # the stack's `kubernetes:context` (None: kubeconfig's current)
    # The (apiVersion, kind) pairs the cluster serves, when the entry point read them (charts disabled);
    # None: not checked, every custom resource is declared.
    served_kinds: frozenset[tuple[str, str]] | None = None


@functools.cache
def catalog_outputs(settings: RuleSettings | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The alert rule groups (rendered for the stack's `settings`) and the dashboard generated from
    the fault catalog. The catalog is package data, fixed for the life of the process, so it is
    parsed once per process and settings."""
    catalog = load_catalog()
    return rule_groups(catalog, settings), dashboard(catalog)


def xid_table(spec: StackSpec) -> dict[int, XidRule]:
    """The catalog's XID policy with the stack's overrides applied (validated with the stack)."""
    table, _ = xid_policy(load_catalog(), spec.remediation.xid_overrides)
    return table


def fabric_resource(spec: StackSpec) -> str | None:
    """The RDMA device resource training pods request, where the stack installs its plugin."""
    if spec.fabric.kind.value == "efa" or connectx_fabric(spec.fabric, vendors(spec)):
        return rdma_resource(spec.fabric)
    return None


def training_pod_template(spec: StackSpec, pool: NodePool) -> dict[str, Any]:
    """What a training pod on this pool requests: every GPU of a node, the fabric's device
    resource, CPU and memory; IPC_LOCK, a memory-backed /dev/shm and the secondary networks for
    RDMA (conventions.md). Kueue stacks label it with the first queue. A template for users to
    start from, and what the queue-coverage test checks against the ClusterQueues."""
    acc = accelerator_spec(pool.accelerator)
    requests: dict[str, str] = {acc.resource_name: str(pool.gpus_per_node), "cpu": "16", "memory": "64Gi"}
    rdma = fabric_resource(spec)
    if rdma is not None:
        requests[rdma] = (
            "1" if spec.fabric.mode is FabricMode.RDMA_SHARED else str(spec.fabric.rails_per_node)
        )
    labels = {**MANAGED_BY, "gpufleet.io/pool": pool.name}
    if spec.scheduler.kind is SchedulerKind.KUEUE:
        labels[QUEUE_LABEL] = spec.scheduler.queues[0].name
    annotations = {}
    nets = (
        [name for _, name, _ in network_crs(spec.fabric)]
        if connectx_fabric(spec.fabric, vendors(spec))
        else []
    )
    if nets:
        annotations["k8s.v1.cni.cncf.io/networks"] = ",".join(nets)
    return {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "nodeSelector": {"gpufleet.io/pool": pool.name},
            "tolerations": [t.toleration() for t in pool_taints(pool)],
            "containers": [
                {
                    "name": "trainer",
                    "image": "REPLACE-WITH-YOUR-TRAINING-IMAGE",
                    "resources": {"requests": requests, "limits": dict(requests)},
                    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def backups_of(spec: StackSpec) -> tuple[CephSpec, JuiceFsSpec, DrSpec] | None:
    """What backups as code are declared from, on a cluster stack with a `dr` section (the stack
    validates that it has the Rook object store and JuiceFS on it); the sandbox's backups are its
    own processes (docs/storage.md)."""
    st, dr = spec.storage, spec.dr
    if dr is None or spec.cluster.environment.value == "sandbox" or st.ceph is None or st.juicefs is None:
        return None
    if st.ceph.object_store is None:
        return None
    return st.ceph, st.juicefs, dr


def vendors(spec: StackSpec) -> frozenset[Vendor]:
    return spec.vendors


def nvidia_nodes(spec: StackSpec) -> int:
    """NVIDIA GPU nodes of the stack (spares included): the fleet the GPU Operator upgrades."""
    return max(1, sum(p.total_nodes for p in spec.node_pools
                      if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA))


def gpu_tolerations(spec: StackSpec) -> list[dict[str, str]]:
    """Tolerations for the node agents (drivers, device plugins, health checks) that must run on
    every GPU node whatever its taints."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for pool in spec.node_pools:
        for t in pool_taints(pool):
            seen.setdefault((t.key, t.effect), t.toleration())
    return [seen[k] for k in sorted(seen)]


def stack_outputs(spec: StackSpec, alerts: int) -> dict[str, Any]:
    """What `pulumi stack output` shows: capacity, fabric, the collective environment per vendor,
    the reliability targets, and the pinned chart versions."""
    return {
        "cluster": spec.cluster.name,
        "environment": spec.cluster.environment.value,
        "gpus": spec.total_gpus,
        "nodes": spec.total_nodes,
        "gpusByPool": {p.name: p.total_gpus for p in spec.node_pools},
        "peakBf16Pflops": round(spec.peak_bf16_pflops, 3),
        "fabric": {
            "kind": spec.fabric.kind.value,
            "mode": spec.fabric.mode.value,
            "railsPerNode": spec.fabric.rails_per_node,
            "linkSpeedGbps": spec.fabric.link_speed_gbps,
            "rdmaResource": fabric_resource(spec),
        },
        "ncclEnv": {v.value: collective_environment(spec.fabric, v) for v in sorted(vendors(spec), key=str)},
        "scheduler": spec.scheduler.kind.value,
        "alerts": alerts,
        "slos": spec.slos.model_dump(mode="json", by_alias=True),
        "gamedaySchedule": spec.gameday.schedule,
        "charts": {k: c.version for k, c in sorted(CHARTS.items())},
    }


class Platform(pulumi.ComponentResource):
    """Every component of one stack."""

    outputs: dict[str, Any]

    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:platform:Platform", name, None, opts)
        plan = ChartPlan(args.spec.charts, args.served_kinds)
        with chart_plan(plan):
            self._build(name, args)
        # What was not declared, and why: the charts when they are disabled, custom resources whose
        # CRD the cluster does not serve. Said in the output, never silently dropped.
        self.outputs["leftOut"] = [x.as_dict() for x in plan.left_out]
        for x in plan.left_out:
            pulumi.log.warn(f"left out: {x.what} ({x.component}): {x.reason}", self)
        self.register_outputs(self.outputs)

    def _build(self, name: str, args: PlatformArgs) -> None:
        spec = args.spec
        tolerations = gpu_tolerations(spec)
        # One explicit provider per stack: every Kubernetes object of the stack goes to the cluster
        # the stack names, never to whatever the ambient kubeconfig points at.
        self.provider = k8s.Provider(
            f"{name}-k8s",
            context=args.kube_context,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        own = pulumi.ResourceOptions(parent=self, provider=self.provider)
        sub = pulumi.ResourceOptions(parent=self, providers=[self.provider])
        ns = k8s.core.v1.Namespace(
            f"{name}-system", metadata={"name": SYSTEM_NAMESPACE, "labels": MANAGED_BY}, opts=own
        )
        system_ns = ns.metadata.apply(lambda m: m.name)
        # Cluster-wide singletons: one Node Feature Discovery (ADR 0020), and cert-manager when
        # something needs certificates (Slinky's webhook, NVSentinel).
        nvidia = Vendor.NVIDIA in vendors(spec)
        hub = Singletons(f"{name}-cluster", spec, sub)

        self.pools = [
            GpuNodePool(f"{name}-pool-{p.name}", GpuNodePoolArgs(p, spec.cluster.name), sub)
            for p in spec.node_pools
        ]
        self.gpu = GpuSoftware(
            f"{name}-gpu",
            GpuSoftwareArgs(
                vendors(spec), spec.fabric.kind, spec.monitoring.dcgm_scrape_interval, tolerations,
                upgrade=spec.upgrade, gpu_nodes=nvidia_nodes(spec), driver_version=pinned_driver(spec),
            ),
            sub,
        )
        self.fabric = Fabric(
            f"{name}-fabric", FabricArgs(spec.fabric, vendors(spec), system_ns, tolerations), sub
        )
        sandbox = spec.cluster.environment.value == "sandbox"
        backups = backups_of(spec)
        self.storage = Storage(
            f"{name}-storage",
            StorageArgs(
                spec.storage,
                protect=not sandbox,
                user_namespaces=(BACKUP_NAMESPACE,) if backups is not None else (),
            ),
            sub,
        )
        self.backups: Backups | None = None
        if backups is not None:
            store = self.storage.object_store
            self.backups = Backups(
                f"{name}-backups",
                BackupsArgs(*backups, after=(store,) if store is not None else (), protect=not sandbox),
                sub,
            )
        groups, board = catalog_outputs(rule_settings(spec))
        self.monitoring = Monitoring(
            f"{name}-monitoring",
            MonitoringArgs(spec.monitoring, groups, board,
                           AMD_EXPORTER_PORT if Vendor.AMD in vendors(spec) else None),
            sub,
        )
        certs = tuple(hub.cert_manager) if hub.cert_manager is not None else ()
        self.scheduler = Scheduler(
            f"{name}-scheduler", SchedulerArgs(spec.scheduler, list(spec.node_pools), certs), sub
        )
        self.healing = SelfHealing(
            f"{name}-healing",
            SelfHealingArgs(spec.remediation, spec.slos, tolerations, xid_table(spec), nvidia, certs),
            sub,
        )
        self.gameday = GamedaySchedule(f"{name}-gameday", GamedayArgs(spec, args.stack_name), sub)
        self.inspect = FleetInspect(
            f"{name}-inspect", FleetInspectArgs(spec, args.stack_name, tolerations, system_ns), sub)
        self.training_templates = [
            k8s.core.v1.PodTemplate(
                f"{name}-training-{p.name}",
                metadata={
                    "name": f"training-{p.name}",
                    "namespace": TRAINING_NAMESPACE,
                    "labels": MANAGED_BY,
                },
                template=training_pod_template(spec, p),
                opts=own,
            )
            for p in spec.node_pools
        ]

        self.outputs = stack_outputs(spec, alert_count(groups))
        # Derived from the declared resources, not restated from the stack file.
        self.outputs["storageClasses"] = self.storage.storage_classes
        self.outputs["queues"] = self.scheduler.queue_names
        self.outputs["endpoints"] = self.monitoring.endpoints
        self.outputs["trainingPodTemplates"] = pulumi.Output.all(
            *(t.metadata for t in self.training_templates)
        ).apply(
            lambda ms: [
                f"{TRAINING_NAMESPACE}/{m.name if not isinstance(m, dict) else m['name']}" for m in ms
            ]
        )


class Singletons(pulumi.ComponentResource):
    """What a cluster runs once whatever the vendors: Node Feature Discovery (the GPU, AMD and
    Network operators each bundle one; NVIDIA's docs require exactly one per cluster), and
    cert-manager when Slinky or NVSentinel need certificates."""

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:cluster:Singletons", name, None, opts)
        vs = vendors(spec)
        self.nfd: k8s.helm.v3.Release | None = None
        if vs - {Vendor.HUAWEI}:
            self.nfd = helm_release(f"{name}-node-feature-discovery", "node-feature-discovery", {}, self)
        self.cert_manager: list[pulumi.Resource] | None = None
        if Vendor.NVIDIA in vs or spec.scheduler.kind is SchedulerKind.SLURM:
            release = helm_release(f"{name}-cert-manager", "cert-manager", {"crds": {"enabled": True}}, self)
            self.cert_manager = [release] if release is not None else None
        self.register_outputs({"nfd": self.nfd is not None, "certManager": self.cert_manager is not None})
