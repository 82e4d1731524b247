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

from gpufleet.catalog import load_catalog
from gpufleet.catalog.dashboard import dashboard
from gpufleet.catalog.rules import rule_groups
from gpufleet.config import StackSpec, Vendor, accelerator_spec, collective_environment
from gpufleet.infra.charts import CHARTS
from gpufleet.infra.common import MANAGED_BY, SYSTEM_NAMESPACE, child
from gpufleet.infra.fabric import Fabric, FabricArgs, rdma_resource
from gpufleet.infra.gameday import GamedayArgs, GamedaySchedule
from gpufleet.infra.gpu_software import GpuSoftware, GpuSoftwareArgs
from gpufleet.infra.monitoring import Monitoring, MonitoringArgs, alert_count
from gpufleet.infra.nodepools import GpuNodePool, GpuNodePoolArgs
from gpufleet.infra.placement import pool_taints
from gpufleet.infra.scheduler import Scheduler, SchedulerArgs
from gpufleet.infra.self_healing import SelfHealing, SelfHealingArgs
from gpufleet.infra.storage import Storage, StorageArgs


@dataclass(frozen=True)
class PlatformArgs:
    spec: StackSpec
    stack_name: str  # the Pulumi stack (the game-day CronJob passes it to `gpufleet gameday`)


@functools.cache
def catalog_outputs() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The alert rule groups and the dashboard generated from the fault catalog. The catalog is
    package data, fixed for the life of the process, so it is parsed once per process."""
    catalog = load_catalog()
    return rule_groups(catalog), dashboard(catalog)


def vendors(spec: StackSpec) -> frozenset[Vendor]:
    return frozenset(accelerator_spec(p.accelerator).vendor for p in spec.node_pools)


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
            "rdmaResource": rdma_resource(spec.fabric),
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
        spec = args.spec
        tolerations = gpu_tolerations(spec)
        ns = k8s.core.v1.Namespace(
            f"{name}-system", metadata={"name": SYSTEM_NAMESPACE, "labels": MANAGED_BY}, opts=child(self)
        )
        system_ns = ns.metadata.apply(lambda m: m.name)
        sub = pulumi.ResourceOptions(parent=self)

        self.pools = [
            GpuNodePool(f"{name}-pool-{p.name}", GpuNodePoolArgs(p, spec.cluster.name), sub)
            for p in spec.node_pools
        ]
        self.gpu = GpuSoftware(
            f"{name}-gpu",
            GpuSoftwareArgs(
                vendors(spec), spec.fabric.kind, spec.monitoring.dcgm_scrape_interval, tolerations
            ),
            sub,
        )
        self.fabric = Fabric(
            f"{name}-fabric", FabricArgs(spec.fabric, vendors(spec), system_ns, tolerations), sub
        )
        self.storage = Storage(f"{name}-storage", StorageArgs(spec.storage), sub)
        groups, board = catalog_outputs()
        self.monitoring = Monitoring(
            f"{name}-monitoring",
            MonitoringArgs(spec.monitoring, groups, board if spec.monitoring.grafana else None),
            sub,
        )
        self.scheduler = Scheduler(
            f"{name}-scheduler", SchedulerArgs(spec.scheduler, list(spec.node_pools)), sub
        )
        self.healing = SelfHealing(
            f"{name}-healing", SelfHealingArgs(spec.remediation, spec.slos, tolerations), sub
        )
        self.gameday = GamedaySchedule(f"{name}-gameday", GamedayArgs(spec, args.stack_name), sub)

        self.outputs = stack_outputs(spec, alert_count(groups))
        self.register_outputs(self.outputs)
