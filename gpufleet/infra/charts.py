"""Every Helm chart and container image the platform installs, pinned, in one table.

A chart without a version silently upgrades on the next `pulumi up`; for operators that manage
drivers and RDMA that is an outage (conventions.md: hooks and chart defaults have torn RDMA down on
upgrade before). Versions are the published release tags as of the project's first release; bump
them here, in one reviewed place. The unit tests and the policy pack reject any release without a
version.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config.gpu_operator import DEFAULT_DRIVER
from gpufleet.config.model import ChartSource, ChartsSpec


@dataclass(frozen=True)
class ChartRef:
    """Where a chart is published and which version we install."""

    chart: str  # chart name, or a full `oci://` reference
    version: str
    namespace: str
    repo: str | None = None  # classic Helm repository URL; None for OCI charts

    @property
    def is_oci(self) -> bool:
        return self.chart.startswith("oci://")


# Coordinates as published (conventions.md, "Charts and CRs").
CHARTS: dict[str, ChartRef] = {
    # NGC Helm repo `nvidia`: https://helm.ngc.nvidia.com/nvidia
    "gpu-operator": ChartRef("gpu-operator", "v25.3.0", "gpu-operator", "https://helm.ngc.nvidia.com/nvidia"),
    "network-operator": ChartRef(
        "network-operator", "25.4.0", "nvidia-network-operator", "https://helm.ngc.nvidia.com/nvidia"
    ),
    # AMD GPU Operator: https://rocm.github.io/gpu-operator (chart `gpu-operator-charts`).
    "amd-gpu-operator": ChartRef(
        "gpu-operator-charts", "v1.2.0", "kube-amd-gpu", "https://rocm.github.io/gpu-operator"
    ),
    # AWS EKS charts: https://aws.github.io/eks-charts
    "aws-efa-k8s-device-plugin": ChartRef(
        "aws-efa-k8s-device-plugin", "v0.5.6", "kube-system", "https://aws.github.io/eks-charts"
    ),
    "juicefs-csi-driver": ChartRef(
        "juicefs-csi-driver", "0.28.2", "kube-system", "https://juicedata.github.io/charts/"
    ),
    "rook-ceph": ChartRef("rook-ceph", "v1.17.4", "rook-ceph", "https://charts.rook.io/release"),
    "kube-prometheus-stack": ChartRef(
        "kube-prometheus-stack", "72.6.2", "monitoring", "https://prometheus-community.github.io/helm-charts"
    ),
    "volcano": ChartRef("volcano", "1.12.1", "volcano-system", "https://volcano-sh.github.io/helm-charts"),
    "kueue": ChartRef("oci://registry.k8s.io/kueue/charts/kueue", "0.12.3", "kueue-system"),
    "slurm-operator": ChartRef("oci://ghcr.io/slinkyproject/charts/slurm-operator", "0.3.0", "slinky"),
    "slurm": ChartRef("oci://ghcr.io/slinkyproject/charts/slurm", "0.3.0", "slurm"),
    "node-problem-detector": ChartRef(
        "node-problem-detector", "2.3.14", "kube-system", "https://charts.deliveryhero.io/"
    ),
    "nvsentinel": ChartRef("oci://ghcr.io/nvidia/nvsentinel", "v0.6.0", "nvsentinel"),
    # Slinky's slurm-operator (its values.yaml, `certManager.enabled: true` by default) and NVSentinel
    # issue their webhook / client certificates through cert-manager: installed once, CRDs included.
    "cert-manager": ChartRef("cert-manager", "v1.17.2", "cert-manager", "https://charts.jetstack.io"),
    # Exactly one Node Feature Discovery per cluster: the GPU, Network and AMD operators each bundle
    # one and each is switched off in favour of this release (ADR 0020).
    "node-feature-discovery": ChartRef(
        "node-feature-discovery",
        "0.17.3",
        "node-feature-discovery",
        "https://kubernetes-sigs.github.io/node-feature-discovery/charts",
    ),
}

# Pod Security admission level of each chart's namespace (kube-system is the cluster's and is left
# alone). Driver, device-plugin, CNI, storage and node-agent operators run privileged pods with host
# paths and host networking; a namespace without a label inherits the cluster default, which on a
# hardened cluster is `baseline` or `restricted` and rejects those pods.
POD_SECURITY: dict[str, str] = {
    "gpu-operator": "privileged",
    "network-operator": "privileged",
    "amd-gpu-operator": "privileged",
    "rook-ceph": "privileged",
    "kube-prometheus-stack": "privileged",  # node-exporter: hostNetwork, hostPID, host paths
    "nvsentinel": "privileged",  # its health monitors read the host's journal and DCGM
    "node-feature-discovery": "privileged",  # nfd-worker mounts /sys, /proc and host paths
    "slurm": "privileged",  # slurmd needs SYS_ADMIN and friends (the chart's capabilities list)
    "volcano": "baseline",
    "kueue": "restricted",
    "slurm-operator": "restricted",
    "cert-manager": "restricted",
}

# Releases whose deletion would pull drivers, RDMA or storage out from under running jobs: a
# `pulumi destroy` leaves them installed (retain_on_delete) for a human to remove.
RETAINED = frozenset(
    {
        "gpu-operator",
        "network-operator",
        "amd-gpu-operator",
        "rook-ceph",
        "juicefs-csi-driver",
        "cert-manager",
    }
)

# Versions of what the operators above install on the nodes (not charts, but just as pinned).
# The NVIDIA driver when the stack pins none (config.gpu_operator.DEFAULT_DRIVER, with its source).
NVIDIA_DRIVER_VERSION = DEFAULT_DRIVER
# DOCA-OFED driver container and RDMA device plugins deployed through the NicClusterPolicy.
DOCA_DRIVER = ("nvcr.io/nvidia/mellanox", "doca-driver", "25.04-0.6.1.0-2")
RDMA_SHARED_DEVICE_PLUGIN = ("ghcr.io/mellanox", "k8s-rdma-shared-dev-plugin", "v1.5.3")
SRIOV_DEVICE_PLUGIN = ("ghcr.io/k8snetworkplumbingwg", "sriov-network-device-plugin", "v3.9.0")
MULTUS = ("ghcr.io/k8snetworkplumbingwg", "multus-cni", "v4.1.0")
CNI_PLUGINS = ("ghcr.io/k8snetworkplumbingwg", "plugins", "v1.5.0")
IPOIB_CNI = ("ghcr.io/mellanox", "ipoib-cni", "v1.2.1")
WHEREABOUTS = ("ghcr.io/k8snetworkplumbingwg", "whereabouts", "v0.7.0")
AMD_DRIVER_VERSION = "6.3.3"  # ROCm release whose amdgpu driver the DeviceConfig builds
ASCEND_DEVICE_PLUGIN_IMAGE = "swr.cn-south-1.myhuaweicloud.com/ascendhub/ascend-k8sdeviceplugin:v6.0.0"
CEPH_IMAGE = "quay.io/ceph/ceph:v19.2.2"


def image_fields(image: tuple[str, str, str]) -> dict[str, str]:
    """The repository / image / version triple as the Network Operator's CRs spell it."""
    repository, name, version = image
    return {"repository": repository, "image": name, "version": version}


def namespace_labels(key: str) -> dict[str, str]:
    """Labels of the namespace of chart `key`: ours, plus its Pod Security level enforced."""
    labels = {"app.kubernetes.io/managed-by": "gpufleet"}
    level = POD_SECURITY.get(key)
    if level is not None:
        for mode in ("enforce", "audit", "warn"):
            labels[f"pod-security.kubernetes.io/{mode}"] = level
    return labels


@dataclass(frozen=True)
class LeftOut:
    """Something the program did not declare, and why (stack output `leftOut`)."""

    what: str  # "helm release gpu-operator v25.3.0" or "NicClusterPolicy nic-cluster-policy"
    component: str  # the Pulumi resource name it would have had
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"what": self.what, "resource": self.component, "reason": self.reason}


@dataclass
class ChartPlan:
    """How the Platform being built gets its charts and custom resources.

    `served`: the (apiVersion, kind) pairs the target cluster serves, read once by the entry point
    when the charts are disabled (nothing of ours installs a CRD then); None = not checked (charts on:
    the CRDs come with the charts, which the custom resources depend on)."""

    charts: ChartsSpec = field(default_factory=ChartsSpec)
    served: frozenset[tuple[str, str]] | None = None
    left_out: list[LeftOut] = field(default_factory=list)


# The plan of the Platform being built. Components are plain constructors called inside
# Platform.__init__ (synchronously), so a context variable set around that call reaches every
# helm_release/custom_resource below without threading the stack's chart setting through each
# component's Args; outside a Platform the default (repositories, nothing checked) applies.
_PLAN: ContextVar[ChartPlan | None] = ContextVar("gpufleet_chart_plan", default=None)


@contextmanager
def chart_plan(plan: ChartPlan) -> Iterator[ChartPlan]:
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def current_plan() -> ChartPlan:
    plan = _PLAN.get()
    return plan if plan is not None else ChartPlan()


def local_archive(ref: ChartRef, local_dir: str) -> str:
    """The archive `helm package` writes for the chart: `<name>-<version>.tgz` (an OCI chart's name
    is the last part of its reference)."""
    name = PurePosixPath(ref.chart).name if ref.is_oci else ref.chart
    return str(PurePosixPath(local_dir) / f"{name}-{ref.version}.tgz")


def local_archives(charts: ChartsSpec, keys: list[str]) -> dict[str, str]:
    """Chart key -> the archive it is installed from, for `source: local`; {} otherwise."""
    if charts.source is not ChartSource.LOCAL:
        return {}
    assert charts.local_dir is not None  # the model requires it for `local`
    return {k: local_archive(CHARTS[k], charts.local_dir) for k in keys}


def chart_namespace(resource_name: str, key: str, parent: pulumi.Resource) -> k8s.core.v1.Namespace | None:
    """The namespace of chart `key` as a resource of ours (so it carries Pod Security labels and
    exists before any Secret the chart reads); None for kube-system, which the cluster owns."""
    ns = CHARTS[key].namespace
    if ns == "kube-system":
        return None
    return k8s.core.v1.Namespace(
        f"{resource_name}-ns",
        metadata={"name": ns, "labels": namespace_labels(key)},
        opts=pulumi.ResourceOptions(parent=parent, retain_on_delete=key in RETAINED),
    )


@dataclass(frozen=True)
class ChartInstall:
    """A chart's release (None when the stack's charts are disabled) and the namespace declared for it."""

    release: k8s.helm.v3.Release | None
    namespace: k8s.core.v1.Namespace | None

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What an object of the chart's operator must wait for: the release (its CRDs and
        webhooks) or, without one, the namespace it lives in."""
        if self.release is not None:
            return [self.release]
        return [self.namespace] if self.namespace is not None else []


def chart_install(
    resource_name: str,
    key: str,
    values: Mapping[str, Any],
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource] | None = None,
    namespace: k8s.core.v1.Namespace | None = None,
    protect: bool = False,
) -> ChartInstall:
    """The namespace of chart `key` (created here unless given) and, unless the stack's charts are
    disabled, a Helm release of the pinned chart, named after the chart so that `helm list` shows what
    users expect. Operators in RETAINED survive `pulumi destroy`; `protect` refuses their deletion.
    With `source: local` the chart comes from `<localDir>/<name>-<version>.tgz`."""
    ref = CHARTS[key]
    plan = current_plan()
    ns = namespace if namespace is not None else chart_namespace(resource_name, key, parent)
    if plan.charts.source is ChartSource.DISABLED:
        plan.left_out.append(
            LeftOut(
                f"helm release {key} {ref.version}",
                resource_name,
                "gpufleet:charts.source is disabled (no chart repository reachable): install it otherwise",
            )
        )
        return ChartInstall(None, ns)
    local = local_archives(plan.charts, [key]).get(key)
    release = k8s.helm.v3.Release(
        resource_name,
        chart=local if local is not None else ref.chart,
        version=ref.version,
        name=key,
        namespace=ref.namespace,
        create_namespace=False,
        repository_opts=(
            k8s.helm.v3.RepositoryOptsArgs(repo=ref.repo) if ref.repo and local is None else None
        ),
        values=dict(values),
        # Wait for the chart's workloads so CRs applied after it find their CRDs and webhooks.
        skip_await=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=[*(depends_on or []), *([ns] if ns is not None else [])],
            retain_on_delete=key in RETAINED,
            protect=protect,
        ),
    )
    return ChartInstall(release, ns)


def helm_release(
    resource_name: str,
    key: str,
    values: Mapping[str, Any],
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource] | None = None,
    namespace: k8s.core.v1.Namespace | None = None,
    protect: bool = False,
) -> k8s.helm.v3.Release | None:
    """chart_install's release: None when the stack's charts are disabled."""
    return chart_install(resource_name, key, values, parent, depends_on, namespace, protect).release


def custom_resource(
    resource_name: str,
    api_version: str,
    kind: str,
    metadata: Mapping[str, Any],
    spec: Any,
    opts: pulumi.ResourceOptions,
) -> k8s.apiextensions.CustomResource | None:
    """A custom resource, or None (recorded in `leftOut`) when the cluster was checked and does not
    serve its kind: `pulumi up` would fail on it, and what is missing is a CRD nothing here
    installs. Its `opts` must make it wait for what installs its CRD (ordering)."""
    plan = current_plan()
    if plan.served is not None and (api_version, kind) not in plan.served:
        plan.left_out.append(
            LeftOut(
                f"{kind} {metadata.get('name')}",
                resource_name,
                f"the cluster serves no {kind} ({api_version}): its CRD is not installed",
            )
        )
        return None
    return k8s.apiextensions.CustomResource(
        resource_name, api_version=api_version, kind=kind, metadata=dict(metadata), spec=spec, opts=opts
    )
