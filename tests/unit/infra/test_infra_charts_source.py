"""`gpufleet:charts`: charts from the repositories, from local archives, or disabled (the
program then declares no release and says so in `leftOut`); custom resources the cluster does not
serve are left out with a reason; what waits for what (the order the mock runtime cannot see)."""

from __future__ import annotations

from typing import Any

import pytest
from infra_testdata import variant

from gpufleet.config import StackSpec
from gpufleet.infra.charts import CHARTS
from gpufleet.infra.discovery import served_kinds
from gpufleet.infra.offline import DeclaredResource, OfflinePreview, run_offline

RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"


def with_charts(name: str, charts: dict[str, Any]) -> StackSpec:
    def change(data: dict[str, Any]) -> None:
        data["charts"] = charts

    return variant(name, change)


def custom_kinds(view: OfflinePreview) -> set[tuple[str, str]]:
    """(apiVersion, kind) of every custom resource the view declares."""
    out = set()
    for r in view.custom():
        if r.type.startswith("kubernetes:") and r.type not in (RELEASE,) and "apiVersion" in r.inputs:
            out.add((str(r.inputs["apiVersion"]), str(r.inputs["kind"])))
    return out


def named(view: OfflinePreview, suffix: str) -> DeclaredResource:
    matches = [r for r in view.resources if r.name.endswith(suffix)]
    assert len(matches) == 1, [r.name for r in matches]
    return matches[0]


@pytest.fixture(scope="module")
def h200_disabled() -> tuple[OfflinePreview, OfflinePreview]:
    """h200-ib with charts from the repositories, and the same with charts disabled."""
    full = run_offline(with_charts("h200-ib", {"source": "repositories"}), "h200-ib")
    off = run_offline(with_charts("h200-ib", {"source": "disabled"}), "h200-ib")
    return full, off


def test_disabled_declares_no_release_and_names_each_in_left_out(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    full, off = h200_disabled
    releases = full.of_type(RELEASE)
    assert releases and off.of_type(RELEASE) == []
    left = {x["resource"]: x for x in off.outputs["leftOut"]}
    for r in releases:
        assert r.name in left, r.name
        chart = str(r.inputs["name"])
        assert left[r.name]["what"] == f"helm release {chart} {CHARTS[chart].version}"
        assert "gpufleet:charts.source is disabled" in left[r.name]["reason"]
    assert full.outputs["leftOut"] == []  # nothing left out with the charts


def test_disabled_keeps_everything_else_and_the_chart_namespaces(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    full, off = h200_disabled
    kept = {r.name for r in full.custom() if r.type != RELEASE}
    # The GPU Operator's ClusterPolicy (and collectors ConfigMap), which its chart would have
    # rendered, are declared instead.
    added = {r.name for r in off.custom()} - kept
    assert kept <= {r.name for r in off.custom()}
    assert "h200-ib-gpu-cluster-policy" in added <= {"h200-ib-gpu-cluster-policy", "h200-ib-gpu-dcgm-metrics"}
    assert {str(r.inputs["metadata"]["name"]) for r in off.of_type(NAMESPACE)} >= {
        "monitoring",
        "rook-ceph",
        "gpu-operator",
    }


def test_custom_resources_wait_for_their_namespace_when_no_release(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    """Without the chart nothing made `monitoring` or `rook-ceph` before the objects in them: they
    must depend on the namespace (a real API server refuses an object in a missing namespace)."""
    _, off = h200_disabled
    urn = {r.name: r.urn for r in off.resources}
    rule = named(off, "monitoring-gpufleet-gpu")
    assert urn["h200-ib-monitoring-kube-prometheus-stack-ns"] in rule.dependencies
    cluster = named(off, "storage-ceph-cluster")
    assert urn["h200-ib-storage-rook-ceph-ns"] in cluster.dependencies
    pool = named(off, "storage-pool-replicapool")
    assert urn["h200-ib-storage-ceph-cluster"] in pool.dependencies


def test_custom_resources_wait_for_their_release_with_charts(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    full, _ = h200_disabled
    urn = {r.name: r.urn for r in full.resources}
    rule = named(full, "monitoring-gpufleet-gpu")
    assert urn["h200-ib-monitoring-kube-prometheus-stack"] in rule.dependencies
    assert urn["h200-ib-fabric-network-operator"] in named(full, "fabric-nic-cluster-policy").dependencies
    assert urn["h200-ib-scheduler-volcano"] in named(full, "scheduler-queue-pretrain").dependencies


def test_cluster_policy_has_every_section_its_crd_requires(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    """nvidia.com_clusterpolicies.yaml (api/nvidia/v1 at the commit tagged v25.3.4) requires these
    sections and operator.defaultRuntime; the e2e tier has the real API server check the rest."""
    _, off = h200_disabled
    spec = named(off, "gpu-cluster-policy").inputs["spec"]
    required = {"daemonsets", "dcgm", "dcgmExporter", "devicePlugin", "driver", "gfd"}
    assert required | {"nodeStatusExporter", "operator", "toolkit"} <= set(spec)
    assert spec["operator"]["defaultRuntime"] in ("docker", "crio", "containerd")
    assert spec["driver"]["version"] and spec["dcgmExporter"]["serviceMonitor"]["enabled"] is True


def test_kinds_the_cluster_does_not_serve_are_left_out_with_a_reason() -> None:
    spec = with_charts("h200-ib", {"source": "disabled"})
    every = custom_kinds(run_offline(spec, "h200-ib"))
    absent = {k for k in every if k[0].startswith("mellanox.com/")}
    assert absent == {("mellanox.com/v1alpha1", "NicClusterPolicy")}
    view = run_offline(spec, "h200-ib", frozenset(every - absent))
    assert custom_kinds(view) == every - absent
    crs = [x for x in view.outputs["leftOut"] if not x["what"].startswith("helm release")]
    assert crs == [
        {
            "what": "NicClusterPolicy nic-cluster-policy",
            "resource": "h200-ib-fabric-nic-cluster-policy",
            "reason": "the cluster serves no NicClusterPolicy (mellanox.com/v1alpha1): "
            "its CRD is not installed",
        }
    ]


def test_local_archives_replace_the_repositories() -> None:
    view = run_offline(with_charts("b200-roce", {"source": "local", "localDir": "/srv/charts"}), "b200-roce")
    releases = view.of_type(RELEASE)
    assert releases
    for r in releases:
        ref = CHARTS[str(r.inputs["name"])]
        base = ref.chart.rsplit("/", 1)[-1]
        assert r.inputs["chart"] == f"/srv/charts/{base}-{ref.version}.tgz"
        assert r.inputs["version"] == ref.version and "repositoryOpts" not in r.inputs


def test_charts_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="source local needs localDir"):
        with_charts("b200-roce", {"source": "local"})
    with pytest.raises(ValueError, match="localDir is read only with source local"):
        with_charts("b200-roce", {"source": "disabled", "localDir": "/srv"})
    with pytest.raises(ValueError, match="source"):
        with_charts("b200-roce", {"source": "off"})


def test_a_flavor_with_topology_is_replaced_not_updated() -> None:
    """Kueue v0.12.3's ResourceFlavor CRD refuses any change to a spec with a topologyName
    (`!has(oldSelf.topologyName) || self == oldSelf`): replace it, deleting first (same name)."""
    view = run_offline(with_charts("b200-roce", {"source": "repositories"}), "b200-roce")
    flavor = named(view, "scheduler-flavor-b200")
    assert flavor.inputs["spec"]["topologyName"] == "gpufleet"
    assert flavor.replace_on_changes == ("spec",) and flavor.delete_before_replace
    urn = {r.name: r.urn for r in view.resources}
    assert urn["b200-roce-scheduler-topology"] in flavor.dependencies
    queue = named(view, "scheduler-clusterqueue-pretrain")
    assert flavor.urn in queue.dependencies  # it names the flavor


def test_served_kinds_reads_established_crds_and_served_versions() -> None:
    def crd(group: str, kind: str, versions: dict[str, bool], established: bool = True) -> dict[str, Any]:
        return {
            "spec": {
                "group": group,
                "names": {"kind": kind},
                "versions": [{"name": v, "served": s} for v, s in versions.items()],
            },
            "status": {"conditions": [{"type": "Established", "status": str(established)}]},
        }

    kinds = served_kinds(
        [
            crd("kueue.x-k8s.io", "ClusterQueue", {"v1beta1": True, "v1alpha1": False}),
            crd("ceph.rook.io", "CephCluster", {"v1": True}, established=False),
        ]
    )
    assert kinds == frozenset({("kueue.x-k8s.io/v1beta1", "ClusterQueue")})


def test_cluster_policy_names_the_collectors_config_map_the_program_declares(
    h200_disabled: tuple[OfflinePreview, OfflinePreview],
) -> None:
    """The chart's dcgmExporter.config.create/data are how its template makes the collectors
    ConfigMap, not ClusterPolicy fields (the API server would prune them): the CR names the
    ConfigMap, and without the chart the program declares it."""
    from gpufleet.config import FabricKind
    from gpufleet.infra.gpu_software import GpuSoftwareArgs, dcgm_metrics_config_map, gpu_operator_values

    _, off = h200_disabled
    spec = named(off, "gpu-cluster-policy").inputs["spec"]
    config = spec["dcgmExporter"].get("config", {})
    assert set(config) <= {"name"}
    values = gpu_operator_values(GpuSoftwareArgs(frozenset(), FabricKind.INFINIBAND, "15s"))
    made = dcgm_metrics_config_map(values)
    maps = [r for r in off.of_type("kubernetes:core/v1:ConfigMap") if r.name.endswith("-dcgm-metrics")]
    if made is None:
        assert maps == [] and config == {}
    else:
        assert config == {"name": made[0]}
        assert [m.inputs["metadata"]["name"] for m in maps] == [made[0]]
        assert maps[0].inputs["metadata"]["namespace"] == CHARTS["gpu-operator"].namespace
        assert maps[0].inputs["data"] == made[1]
