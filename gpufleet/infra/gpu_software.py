"""GPU software per vendor present in the stack: NVIDIA GPU Operator, AMD GPU Operator with its
DeviceConfig, the Ascend device plugin.

GPU Operator values (its chart's values.yaml, conventions.md): `driver.version` pinned,
`driver.rdma.enabled` for GPUDirect RDMA when the fabric is InfiniBand/RoCE, an upgrade policy that
drains one node at a time, `dcgmExporter.serviceMonitor` on so kube-prometheus-stack scrapes DCGM.
dcgm-exporter collects only the fields its collectors file lists, and the stock file the Operator
points it at (dcp-metrics-included.csv) lacks fields the catalog's rules read: the program deploys
the catalog's file instead through the chart's `dcgmExporter.config` (name, create, data: a ConfigMap
with key dcgm-metrics.csv that the Operator mounts and sets DCGM_EXPORTER_COLLECTORS to; gpu-operator
v25.3.0 templates/dcgm_exporter_config.yaml, controllers/object_controls.go). Its collect interval
(DCGM_EXPORTER_INTERVAL, default 30000 ms in dcgm-exporter's pkg/cmd/app.go) is set to the scrape
interval, so a scrape never reads a value older than one interval.
AMD: `amd.com/v1alpha1 DeviceConfig` selecting nodes by NFD's `feature.node.kubernetes.io/amd-gpu`.
Ascend: the MindCluster device plugin as a DaemonSet on nodes labelled `accelerator:
huawei-Ascend910` (the labels the Ascend tooling uses; there is no published Helm chart for it),
under the ServiceAccount and ClusterRole its upstream manifests ship (MindCluster's
device-plugin-*.yaml: `ascend-device-plugin-sa`, `pods-node-ascend-device-plugin-role`).

Node Feature Discovery runs once per cluster (a release of its own, gpufleet.infra.platform): the
GPU Operator's bundled NFD (`nfd.enabled`) and the AMD operator's (`node-feature-discovery.enabled`,
helm-charts/values.yaml at v1.2.0) are switched off. The AMD operands tolerate the pools' taints
through the DeviceConfig fields its CRD has at v1.2.0 (helm-charts/crds/deviceconfig-crd.yaml:
`devicePlugin.devicePluginTolerations`, `devicePlugin.nodeLabellerTolerations`,
`metricsExporter.tolerations`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.catalog.exporters import collectors_csv, load_exporters
from gpufleet.config import FabricKind, Vendor
from gpufleet.config.gpu_operator import driver_upgrade_policy
from gpufleet.config.model import UpgradeSpec, duration_seconds
from gpufleet.infra.charts import (
    AMD_DRIVER_VERSION,
    ASCEND_DEVICE_PLUGIN_IMAGE,
    CHARTS,
    NVIDIA_DRIVER_VERSION,
    chart_install,
    custom_resource,
)
from gpufleet.infra.common import MANAGED_BY, child
from gpufleet.infra.monitoring import NODE_RELABELING

DCGM_METRICS_CONFIGMAP = "gpufleet-dcgm-metrics"
AMD_EXPORTER_PORT = 5000  # the DeviceConfig's metricsExporter port (the Monitoring's PodMonitor scrapes it)


@dataclass(frozen=True)
class GpuSoftwareArgs:
    vendors: frozenset[Vendor]
    fabric_kind: FabricKind
    dcgm_scrape_interval: str
    tolerations: list[dict[str, str]] = field(default_factory=list)  # the GPU pools' taints
    mig_strategy: str = "single"
    # dcgm-exporter's collectors file; None: the catalog's (monitoring/dcgm-exporter/dcgm-metrics.csv).
    dcgm_collectors: str | None = None
    # The stack's rollout policy and its NVIDIA node count: the driver's upgradePolicy
    # (config.gpu_operator.driver_upgrade_policy).
    upgrade: UpgradeSpec = field(default_factory=UpgradeSpec)
    gpu_nodes: int = 1
    driver_version: str = NVIDIA_DRIVER_VERSION  # the NVIDIA pools' pin (config.gpu_operator.pinned_driver)


def gpu_operator_values(args: GpuSoftwareArgs) -> dict[str, Any]:
    rdma = args.fabric_kind in (FabricKind.INFINIBAND, FabricKind.ROCE)
    return {
        "driver": {
            "enabled": True,
            "version": args.driver_version,
            # GPUDirect RDMA through the DOCA/MOFED driver the Network Operator installs.
            "rdma": {"enabled": rdma, "useHostMofed": False},
            "upgradePolicy": driver_upgrade_policy(args.upgrade, args.gpu_nodes),
        },
        "mig": {"strategy": args.mig_strategy},
        "dcgmExporter": {
            "enabled": True,
            # A list value replaces the chart's whole default env: its LISTEN and KUBERNETES stay.
            "env": [
                {"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"},
                {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                {"name": "DCGM_EXPORTER_INTERVAL",
                 "value": str(round(duration_seconds(args.dcgm_scrape_interval) * 1000))},
            ],
            "config": {
                "name": DCGM_METRICS_CONFIGMAP,
                "create": True,
                "data": args.dcgm_collectors if args.dcgm_collectors is not None
                else collectors_csv(load_exporters()),
            },
            "serviceMonitor": {
                "enabled": True,
                "interval": args.dcgm_scrape_interval,
                "relabelings": NODE_RELABELING,
            },
        },
        "gdrcopy": {"enabled": rdma},
        "cdi": {"enabled": True},
        "daemonsets": {"tolerations": args.tolerations},
        "nfd": {"enabled": False},  # the cluster's single NFD is installed separately
    }


CLUSTER_POLICY_NAME = "cluster-policy"  # the name the GPU Operator chart gives its ClusterPolicy


def cluster_policy_spec(args: GpuSoftwareArgs) -> dict[str, Any]:
    """The GPU Operator's ClusterPolicy for an operator installed without the chart (e.g. through
    OLM, which leaves the ClusterPolicy to the user): the same decisions as gpu_operator_values.
    The CRD (api/nvidia/v1 at the commit tagged v25.3.4, generated in the sandbox) requires
    operator.defaultRuntime and the daemonsets, dcgm, dcgmExporter, devicePlugin, driver, gfd,
    nodeStatusExporter and toolkit sections; component images are left to the operator's
    defaults (its deployment's *_IMAGE environment, `imagePath` in clusterpolicy_types.go).
    Switches not in gpu_operator_values take the chart's defaults (values.yaml at that commit):
    toolkit, device plugin and GFD on, standalone DCGM and the node status exporter off."""
    values = gpu_operator_values(args)
    exporter = {k: v for k, v in values["dcgmExporter"].items() if k != "config"}
    config = values["dcgmExporter"].get("config") or {}
    if config.get("name"):
        # The CR names the collectors ConfigMap; the chart's `create`/`data` are how its template
        # makes that ConfigMap (templates/clusterpolicy.yaml, dcgm_exporter_config.yaml), not CR
        # fields: the API server would prune them. Without the chart, dcgm_metrics_config_map.
        exporter["config"] = {"name": config["name"]}
    return {
        "operator": {"defaultRuntime": "containerd"},
        "daemonsets": {"tolerations": values["daemonsets"]["tolerations"]},
        "driver": values["driver"],
        "toolkit": {"enabled": True},
        "devicePlugin": {"enabled": True},
        "dcgm": {"enabled": False},
        "dcgmExporter": exporter,
        "gfd": {"enabled": True},
        "nodeStatusExporter": {"enabled": False},
        "mig": values["mig"],
        "gdrcopy": values["gdrcopy"],
        "cdi": values["cdi"],
    }


def dcgm_metrics_config_map(values: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """(name, data) of the collectors ConfigMap the GPU Operator chart would make from
    `dcgmExporter.config` (key dcgm-metrics.csv, templates/dcgm_exporter_config.yaml), or None."""
    config = values["dcgmExporter"].get("config") or {}
    if not (config.get("create") and config.get("data") and config.get("name")):
        return None
    return str(config["name"]), {"dcgm-metrics.csv": str(config["data"])}


def amd_operator_values() -> dict[str, Any]:
    # The operator's own NFD is off; its default NodeFeatureRule (the amd-gpu label) stays on and is
    # served by the cluster's single NFD.
    return {"node-feature-discovery": {"enabled": False}, "installdefaultNFDRule": True}


def amd_device_config_spec(tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    tol = list(tolerations or [])
    return {
        "driver": {"enable": True, "version": AMD_DRIVER_VERSION},
        "devicePlugin": {
            "enableNodeLabeller": True,
            "devicePluginTolerations": tol,
            "nodeLabellerTolerations": tol,
        },
        "metricsExporter": {
            "enable": True, "serviceType": "ClusterIP", "port": AMD_EXPORTER_PORT, "tolerations": tol,
        },
        "selector": {"feature.node.kubernetes.io/amd-gpu": "true"},
    }


ASCEND_SERVICE_ACCOUNT = "ascend-device-plugin-sa"
ASCEND_ROLE = "pods-node-ascend-device-plugin-role"


def ascend_rbac_rules() -> list[dict[str, Any]]:
    """What the device plugin does to the API (its upstream ClusterRole): annotate pods with the
    NPUs they got, patch node status/labels with NPU health, keep per-node device-info ConfigMaps."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "update", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch", "update"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "create", "update", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def ascend_daemonset_spec(tolerations: list[dict[str, str]]) -> dict[str, Any]:
    labels = {"app": "ascend-device-plugin"}
    host = [
        ("device-plugin", "/var/lib/kubelet/device-plugins"),
        ("log", "/var/log/mindx-dl/devicePlugin"),
        ("driver", "/usr/local/Ascend/driver"),
    ]
    return {
        "selector": {"matchLabels": labels},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": ASCEND_SERVICE_ACCOUNT,
                "nodeSelector": {"accelerator": "huawei-Ascend910"},
                "tolerations": tolerations,
                "priorityClassName": "system-node-critical",
                "containers": [
                    {
                        "name": "device-plugin",
                        "image": ASCEND_DEVICE_PLUGIN_IMAGE,
                        "command": [
                            "/bin/bash",
                            "-c",
                            "device-plugin -useAscendDocker=false -volcanoType=true",
                        ],
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": n, "mountPath": p} for n, p in host],
                    }
                ],
                "volumes": [{"name": n, "hostPath": {"path": p}} for n, p in host],
            },
        },
    }


class GpuSoftware(pulumi.ComponentResource):
    """Device drivers, device plugins and GPU telemetry for every vendor in the stack."""

    def __init__(self, name: str, args: GpuSoftwareArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:gpu:GpuSoftware", name, None, opts)
        installed: list[str] = []
        self.cluster_policy: k8s.apiextensions.CustomResource | None = None
        if Vendor.NVIDIA in args.vendors:
            gpu = chart_install(f"{name}-gpu-operator", "gpu-operator", gpu_operator_values(args), self)
            self.gpu_operator = gpu.release
            if gpu.release is None:
                # No chart, so no ClusterPolicy and collectors ConfigMap from it: declared here, as
                # for an OLM install.
                deps = list(gpu.ready)
                collectors = dcgm_metrics_config_map(gpu_operator_values(args))
                if collectors is not None:
                    deps.append(
                        k8s.core.v1.ConfigMap(
                            f"{name}-dcgm-metrics",
                            metadata={
                                "name": collectors[0],
                                "namespace": CHARTS["gpu-operator"].namespace,
                                "labels": MANAGED_BY,
                            },
                            data=collectors[1],
                            opts=child(self, gpu.ready),
                        )
                    )
                self.cluster_policy = custom_resource(
                    f"{name}-cluster-policy",
                    "nvidia.com/v1",
                    "ClusterPolicy",
                    {"name": CLUSTER_POLICY_NAME, "labels": MANAGED_BY},
                    cluster_policy_spec(args),
                    child(self, deps),
                )
            else:
                installed.append("gpu-operator")
        if Vendor.AMD in args.vendors:
            amd = chart_install(f"{name}-amd-gpu-operator", "amd-gpu-operator", amd_operator_values(), self)
            self.amd_operator = amd.release
            self.device_config = custom_resource(
                f"{name}-amd-deviceconfig",
                "amd.com/v1alpha1",
                "DeviceConfig",
                {"name": "gpufleet", "namespace": CHARTS["amd-gpu-operator"].namespace},
                amd_device_config_spec(args.tolerations),
                child(self, amd.ready),
            )
            if amd.release is not None:
                installed.append("amd-gpu-operator")
        if Vendor.HUAWEI in args.vendors:
            sa = k8s.core.v1.ServiceAccount(
                f"{name}-ascend-sa",
                metadata={"name": ASCEND_SERVICE_ACCOUNT, "namespace": "kube-system", "labels": MANAGED_BY},
                opts=child(self),
            )
            role = k8s.rbac.v1.ClusterRole(
                f"{name}-ascend-role",
                metadata={"name": ASCEND_ROLE, "labels": MANAGED_BY},
                rules=ascend_rbac_rules(),
                opts=child(self),
            )
            binding = k8s.rbac.v1.ClusterRoleBinding(
                f"{name}-ascend-binding",
                metadata={"name": f"{ASCEND_ROLE}binding", "labels": MANAGED_BY},
                role_ref={
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": ASCEND_ROLE,
                },
                subjects=[
                    {"kind": "ServiceAccount", "name": ASCEND_SERVICE_ACCOUNT, "namespace": "kube-system"}
                ],
                opts=child(self, [sa, role]),
            )
            self.ascend_plugin = k8s.apps.v1.DaemonSet(
                f"{name}-ascend-device-plugin",
                metadata={"name": "ascend-device-plugin", "namespace": "kube-system", "labels": MANAGED_BY},
                spec=ascend_daemonset_spec(args.tolerations),
                opts=child(self, [binding]),
            )
            installed.append("ascend-device-plugin")
        self.installed = pulumi.Output.from_input(installed)
        self.register_outputs({"installed": self.installed})
