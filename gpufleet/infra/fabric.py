"""The training fabric: NVIDIA Network Operator + NicClusterPolicy + per-mode network CRs, the AWS
EFA device plugin, and the collective library's environment as a ConfigMap.

Since Network Operator 24.10 the chart no longer creates the NicClusterPolicy: it is applied here
as an ordinary custom resource after the release, never as a Helm hook (a hook is deleted and
recreated on upgrade, which tears RDMA down on every node; conventions.md). Sections and CRs from
the Network Operator's CRD reference: `ofedDriver`, `rdmaSharedDevicePlugin.config` (configList of
resourceName + selectors), `sriovDevicePlugin`, `secondaryNetwork` (multus, cniPlugins, ipoib,
whereabouts); `HostDeviceNetwork` (SR-IOV), `IPoIBNetwork` (IPoIB).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config import FabricKind, FabricMode, FabricSpec, Vendor, collective_environment
from gpufleet.infra.charts import (
    CNI_PLUGINS,
    DOCA_DRIVER,
    IPOIB_CNI,
    MULTUS,
    RDMA_SHARED_DEVICE_PLUGIN,
    SRIOV_DEVICE_PLUGIN,
    WHEREABOUTS,
    chart_install,
    custom_resource,
    helm_release,
    image_fields,
)
from gpufleet.infra.common import MANAGED_BY, child

MELLANOX_VENDOR_ID = "15b3"  # PCI vendor of ConnectX NICs (NFD label pci-15b3.present)
NIC_POLICY_NAME = "nic-cluster-policy"  # the Network Operator reconciles only this name
TRAINING_NAMESPACE = "default"  # where the secondary networks are offered to training pods


@dataclass(frozen=True)
class FabricArgs:
    fabric: FabricSpec
    vendors: frozenset[Vendor]
    namespace: pulumi.Input[str]  # gpufleet's own namespace (NCCL environment ConfigMap)
    tolerations: list[dict[str, str]]


def rdma_resource(fabric: FabricSpec) -> str | None:
    """The extended resource a training pod requests for RDMA on this fabric."""
    if fabric.mode is FabricMode.RDMA_SHARED:
        return "rdma/shared_ib" if fabric.kind is FabricKind.INFINIBAND else "rdma/shared_roce"
    if fabric.mode is FabricMode.SRIOV:
        return "nvidia.com/hostdev"
    if fabric.mode is FabricMode.EFA:
        return "vpc.amazonaws.com/efa"
    return None  # IPoIB: the pod gets an IPoIB interface through Multus, no device resource


def connectx_fabric(fabric: FabricSpec, vendors: frozenset[Vendor]) -> bool:
    """Whether the fabric runs on ConnectX NICs the NVIDIA Network Operator manages: InfiniBand or
    RoCE with NVIDIA or AMD GPUs. Ascend servers' RoCE ports sit on the NPUs themselves and are
    driven by the Ascend driver (HCCL), so an Ascend-only stack installs no Network Operator."""
    if fabric.kind not in (FabricKind.INFINIBAND, FabricKind.ROCE):
        return False
    return bool(vendors - {Vendor.HUAWEI})


def rail_ipam(rail: int) -> str:
    """Whereabouts IPAM of rail `rail`: one /16 per rail inside 172.16.0.0/12 (16 rails at most,
    the model's limit), so rail-optimised traffic stays on its own subnet."""
    return json.dumps({"type": "whereabouts", "range": f"172.{16 + rail}.0.0/16"})


def nic_cluster_policy_spec(fabric: FabricSpec) -> dict[str, Any]:
    """The NicClusterPolicy for an InfiniBand or RoCE fabric in the declared mode."""
    link = "infiniband" if fabric.kind is FabricKind.INFINIBAND else "ether"
    spec: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "feature.node.kubernetes.io/pci-15b3.present",
                                "operator": "In",
                                "values": ["true"],
                            }
                        ]
                    }
                ]
            }
        },
        "ofedDriver": {
            **image_fields(DOCA_DRIVER),
            # Reloading the NIC driver drops every RDMA connection on the node: one node at a time.
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": 1,
                "drain": {"enable": True, "force": False, "timeoutSeconds": 600},
            },
        },
        "secondaryNetwork": {
            "multus": image_fields(MULTUS),
            "cniPlugins": image_fields(CNI_PLUGINS),
            "ipamPlugin": image_fields(WHEREABOUTS),
        },
    }
    if fabric.mode is FabricMode.RDMA_SHARED:
        resource = (rdma_resource(fabric) or "").removeprefix("rdma/")
        config = {
            "configList": [
                {
                    "resourceName": resource,
                    "rdmaHcaMax": 63,  # pods sharing the HCAs per node; the plugin's documented example
                    "selectors": {"vendors": [MELLANOX_VENDOR_ID], "linkTypes": [link]},
                }
            ]
        }
        spec["rdmaSharedDevicePlugin"] = {
            **image_fields(RDMA_SHARED_DEVICE_PLUGIN),
            "config": json.dumps(config),
        }
    elif fabric.mode is FabricMode.SRIOV:
        config = {
            "resourceList": [
                {
                    "resourcePrefix": "nvidia.com",
                    "resourceName": "hostdev",
                    "selectors": {"vendors": [MELLANOX_VENDOR_ID], "isRdma": True},
                }
            ]
        }
        spec["sriovDevicePlugin"] = {**image_fields(SRIOV_DEVICE_PLUGIN), "config": json.dumps(config)}
    elif fabric.mode is FabricMode.IPOIB:
        spec["secondaryNetwork"]["ipoib"] = image_fields(IPOIB_CNI)
    return spec


def network_crs(fabric: FabricSpec) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, name, spec) of the secondary networks of the mode: one HostDeviceNetwork for SR-IOV,
    one IPoIBNetwork per rail for IPoIB (each rail its own subnet); none for the shared plugin."""
    if fabric.mode is FabricMode.SRIOV:
        return [
            (
                "HostDeviceNetwork",
                "hostdev-net",
                {
                    "networkNamespace": TRAINING_NAMESPACE,
                    "resourceName": "nvidia.com/hostdev",
                    "ipam": rail_ipam(0),
                },
            )
        ]
    if fabric.mode is FabricMode.IPOIB:
        # IPoIB netdevs are named ib<N> by the kernel's default naming on most hosts.
        return [
            (
                "IPoIBNetwork",
                f"ipoib-rail-{r}",
                {"networkNamespace": TRAINING_NAMESPACE, "master": f"ib{r}", "ipam": rail_ipam(r)},
            )
            for r in range(fabric.rails_per_node)
        ]
    return []


class Fabric(pulumi.ComponentResource):
    """RDMA networking and the collective library's environment."""

    def __init__(self, name: str, args: FabricArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:fabric:Fabric", name, None, opts)
        fabric = args.fabric
        self.nic_cluster_policy: k8s.apiextensions.CustomResource | None = None
        if connectx_fabric(fabric, args.vendors):
            operator = chart_install(
                f"{name}-network-operator",
                "network-operator",
                {
                    "nfd": {"enabled": False},  # the cluster's single NFD is installed separately
                    "sriovNetworkOperator": {"enabled": False},
                    "operator": {"tolerations": args.tolerations},
                },
                self,
            )
            self.network_operator = operator.release
            self.nic_cluster_policy = custom_resource(
                f"{name}-nic-cluster-policy",
                "mellanox.com/v1alpha1",
                "NicClusterPolicy",
                {"name": NIC_POLICY_NAME, "labels": MANAGED_BY},
                nic_cluster_policy_spec(fabric),
                child(self, operator.ready),
            )
            for kind, cr_name, spec in network_crs(fabric):
                custom_resource(
                    f"{name}-{cr_name}",
                    "mellanox.com/v1alpha1",
                    kind,
                    {"name": cr_name, "labels": MANAGED_BY},
                    spec,
                    child(self, [self.nic_cluster_policy] if self.nic_cluster_policy else operator.ready),
                )
        elif fabric.kind is FabricKind.EFA:
            self.efa_plugin = helm_release(
                f"{name}-efa-device-plugin",
                "aws-efa-k8s-device-plugin",
                {"tolerations": args.tolerations},
                self,
            )
        self.environments: dict[str, dict[str, str]] = {}
        for vendor in sorted(args.vendors, key=lambda v: v.value):
            env = collective_environment(fabric, vendor)
            self.environments[vendor.value] = env
            k8s.core.v1.ConfigMap(
                f"{name}-collective-env-{vendor.value}",
                metadata={
                    "name": f"collective-env-{vendor.value}",
                    "namespace": args.namespace,
                    "labels": {
                        **MANAGED_BY,
                        "gpufleet.io/vendor": vendor.value,
                        "gpufleet.io/fabric": fabric.kind.value,
                    },
                },
                data=env,
                opts=child(self),
            )
        self.rdma_resource = rdma_resource(fabric) if (connectx_fabric(fabric, args.vendors) or
                                                       fabric.kind is FabricKind.EFA) else None
        self.register_outputs({"collectiveEnv": self.environments, "rdmaResource": self.rdma_resource})
