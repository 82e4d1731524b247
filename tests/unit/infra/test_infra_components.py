"""Components one by one under Pulumi's mock runtime (`set_mocks` + `@pulumi.runtime.test`), and
stack variants that exercise the branches the shipped stacks do not (Karpenter, EFA, IPoIB, Kueue,
Slurm, monitor-only remediation)."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
from infra_testdata import load_policies, variant

from gpufleet.config import Secret, collective_environment
from gpufleet.config.model import RemediationSpec, SloSpec
from gpufleet.infra import GpuNodePool, GpuNodePoolArgs, Storage, StorageArgs
from gpufleet.infra.common import OFFLINE_SECRET, secret_input
from gpufleet.infra.offline import run_offline
from gpufleet.infra.self_healing import health_check_interval_seconds, npd_plugin_config, nvsentinel_values


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[Any, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], None]:
        return {}, None


@pytest.fixture(autouse=True)
def _mocks() -> None:
    pulumi.runtime.set_mocks(_Mocks(), project="gpufleet", stack="unit", preview=False)


@pulumi.runtime.test
def test_secret_input_is_a_pulumi_secret() -> pulumi.Output[Any]:
    plain = secret_input(Secret(plain="redis://meta:6379/1"))
    cipher = secret_input(Secret(secure="v1:abc"))

    def check(args: list[Any]) -> None:
        plain_secret, cipher_secret, cipher_value = args
        assert plain_secret and cipher_secret
        assert cipher_value == OFFLINE_SECRET  # ciphertext is never passed on as a value

    return pulumi.Output.all(
        pulumi.Output.from_input(plain.is_secret()), pulumi.Output.from_input(cipher.is_secret()), cipher
    ).apply(check)


def _storage_spec() -> Any:
    return variant("h200-ib", lambda d: None).storage


@pulumi.runtime.test
def test_juicefs_secret_output_is_secret() -> pulumi.Output[Any]:
    storage = Storage("st", StorageArgs(_storage_spec()))

    def check(args: list[Any]) -> None:
        classes, secret = args
        assert classes == ["juicefs-ckpt"]  # read back from the StorageClass resource
        assert secret is True

    return pulumi.Output.all(
        storage.storage_classes, pulumi.Output.from_input(storage.juicefs_secret.string_data.is_secret())
    ).apply(check)


def _true(value: bool) -> None:
    assert value is True


@pulumi.runtime.test
def test_static_pool_patches_each_node_with_labels_and_taints() -> pulumi.Output[Any]:
    pool = variant("h200-ib", lambda d: None).node_pools[0]
    comp = GpuNodePool("p", GpuNodePoolArgs(pool, "c"))
    assert len(comp.patches) == pool.total_nodes

    def check(args: list[Any]) -> None:
        meta, spec = args
        assert meta["name"] == pool.node_names()[-1]
        assert meta["labels"]["gpufleet.io/role"] == "spare"
        assert meta["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in [
            {k: t[k] for k in ("key", "value", "effect") if k in t} for t in spec["taints"]
        ]

    last = comp.patches[-1]
    return pulumi.Output.all(last.metadata, last.spec).apply(check)


def _karpenter(d: dict[str, Any]) -> None:
    d["nodePools"][0]["provisioning"] = {"kind": "karpenter", "instanceTypes": ["p5e.48xlarge"]}


def test_karpenter_pool_declares_a_node_pool_and_class_and_nothing_per_node() -> None:
    spec = variant("scale-10k", _karpenter)
    view = run_offline(spec, "karp")
    counts = view.by_type()
    assert counts["kubernetes:core/v1:NodePatch"] == 0
    (node_pool,) = view.of_type("kubernetes:karpenter.sh/v1:NodePool")
    (node_class,) = view.of_type("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    template = node_pool.inputs["spec"]["template"]
    assert template["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in template["spec"]["taints"]
    assert template["spec"]["nodeClassRef"]["name"] == node_class.inputs["metadata"]["name"]
    assert node_pool.inputs["spec"]["limits"] == {"nvidia.com/gpu": str(spec.total_gpus)}
    assert view.of_type("kubernetes:topology.volcano.sh/v1alpha1:HyperNode") == []
    assert load_policies().gpu_node_tainted_and_labelled(node_pool.type, node_pool.inputs) == []
    assert len(view.custom()) < 60  # a fixed set per stack, nothing per node of the 1,250


def _efa(d: dict[str, Any]) -> None:
    _karpenter(d)
    d["fabric"] = {"kind": "efa", "railsPerNode": 8, "nicsPerNode": 8, "linkSpeedGbps": 400, "mode": "efa"}


def test_efa_fabric_installs_the_efa_plugin_and_sets_libfabric() -> None:
    spec = variant("scale-10k", _efa)
    view = run_offline(spec, "efa")
    assert view.of_type("kubernetes:mellanox.com/v1alpha1:NicClusterPolicy") == []
    names = {r.inputs["name"] for r in view.of_type("kubernetes:helm.sh/v3:Release")}
    assert "aws-efa-k8s-device-plugin" in names and "network-operator" not in names
    (env,) = [
        r.inputs["data"]
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
        if r.inputs["metadata"]["name"] == "collective-env-nvidia"
    ]
    assert env["FI_PROVIDER"] == "efa" and env == collective_environment(spec.fabric, spec_vendor(spec))
    assert view.outputs["fabric"]["rdmaResource"] == "vpc.amazonaws.com/efa"
    assert load_policies().nccl_env_matches_fabric([(r.type, r.inputs) for r in view.custom()]) == []


def spec_vendor(spec: Any) -> Any:
    from gpufleet.infra.platform import vendors

    (v,) = vendors(spec)
    return v


def test_ipoib_mode_declares_one_network_per_rail() -> None:
    spec = variant("h200-ib", lambda d: d["fabric"].update(mode="ipoib"))
    view = run_offline(spec, "ipoib")
    nets = view.of_type("kubernetes:mellanox.com/v1alpha1:IPoIBNetwork")
    assert len(nets) == spec.fabric.rails_per_node
    assert len({n.inputs["spec"]["ipam"] for n in nets}) == len(nets)  # one subnet per rail
    (policy,) = view.of_type("kubernetes:mellanox.com/v1alpha1:NicClusterPolicy")
    assert "ipoib" in policy.inputs["spec"]["secondaryNetwork"]


def test_sriov_mode_declares_a_host_device_network() -> None:
    _, view = spec_and_view("b200-roce")
    (net,) = view.of_type("kubernetes:mellanox.com/v1alpha1:HostDeviceNetwork")
    assert net.inputs["spec"]["resourceName"] == "nvidia.com/hostdev"


def spec_and_view(name: str) -> tuple[Any, Any]:
    from infra_testdata import shipped

    return shipped(name)


def test_kueue_declares_flavors_queues_and_topology() -> None:
    spec, view = spec_and_view("b200-roce")
    assert len(view.of_type("kubernetes:kueue.x-k8s.io/v1beta1:ResourceFlavor")) == len(spec.node_pools)
    cqs = view.of_type("kubernetes:kueue.x-k8s.io/v1beta1:ClusterQueue")
    assert {c.inputs["metadata"]["name"] for c in cqs} == {q.name for q in spec.scheduler.queues}
    quota = {
        c.inputs["metadata"]["name"]: c.inputs["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
        for c in cqs
    }
    assert quota["pretrain"] == {"name": "nvidia.com/gpu", "nominalQuota": 480}
    assert len(view.of_type("kubernetes:kueue.x-k8s.io/v1beta1:LocalQueue")) == len(cqs)
    assert len(view.of_type("kubernetes:kueue.x-k8s.io/v1alpha1:Topology")) == 1


def test_slurm_scheduler_installs_slinky() -> None:
    _, view = spec_and_view("sandbox")
    names = {r.inputs["name"] for r in view.of_type("kubernetes:helm.sh/v3:Release")}
    assert {"slurm-operator", "slurm"} <= names and "volcano" not in names


def test_volcano_queues_carry_quotas_in_the_vendor_resource() -> None:
    _, view = spec_and_view("mi300x-roce")
    queues = {
        q.inputs["metadata"]["name"]: q.inputs["spec"]
        for q in view.of_type("kubernetes:scheduling.volcano.sh/v1beta1:Queue")
    }
    assert queues["train"]["capability"] == {"amd.com/gpu": "768"}
    (dc,) = view.of_type("kubernetes:amd.com/v1alpha1:DeviceConfig")
    assert dc.inputs["spec"]["selector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}


def test_ascend_gets_its_device_plugin_and_hccl_environment() -> None:
    _, view = spec_and_view("ascend-910b-roce")
    (ds,) = view.of_type("kubernetes:apps/v1:DaemonSet")
    pod = ds.inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert {"key": "huawei.com/Ascend910", "effect": "NoSchedule", "operator": "Exists"} in pod["tolerations"]
    names = {r.inputs["name"] for r in view.of_type("kubernetes:helm.sh/v3:Release")}
    assert "gpu-operator" not in names


def test_monitoring_declares_catalog_rules_and_dashboard() -> None:
    from gpufleet.catalog import load_catalog
    from gpufleet.catalog.rules import rule_groups

    _, view = spec_and_view("h200-ib")
    groups = rule_groups(load_catalog())
    rules = view.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert sorted(g["name"] for r in rules for g in r.inputs["spec"]["groups"]) == sorted(
        g["name"] for g in groups
    )
    assert view.outputs["alerts"] == sum(1 for g in groups for r in g["rules"] if "alert" in r)
    (board,) = [
        r
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
        if r.inputs["metadata"]["name"] == "gpufleet-dashboard"
    ]
    assert board.inputs["metadata"]["labels"]["grafana_dashboard"] == "1"
    (gpu_op,) = [
        r for r in view.of_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "gpu-operator"
    ]
    assert gpu_op.inputs["values"]["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    assert gpu_op.inputs["values"]["driver"]["version"]


def test_no_grafana_no_dashboard() -> None:
    spec = variant("mi300x-roce", lambda d: d["monitoring"].update(grafana=False))
    view = run_offline(spec, "nograf")
    assert all(
        r.inputs["metadata"]["name"] != "gpufleet-dashboard"
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
    )


@pytest.mark.parametrize(
    ("mode", "dry", "drain"),
    [("monitor-only", True, False), ("cordon", False, False), ("cordon-drain-remediate", False, True)],
)
def test_nvsentinel_follows_the_remediation_mode_and_breaker(mode: str, dry: bool, drain: bool) -> None:
    rem = RemediationSpec.model_validate(
        {"mode": mode, "circuitBreaker": {"maxQuarantinedShare": 0.021, "windowMinutes": 2.5}}
    )
    values = nvsentinel_values(rem, [])
    assert values["global"]["dryRun"] is dry
    assert values["global"]["nodeDrainer"]["enabled"] is drain
    assert values["fault-quarantine"]["circuitBreaker"] == {
        "enabled": True,
        "percentage": 3,
        "duration": "150s",
    }


def test_npd_runs_node_health_within_the_tightest_detection_budget() -> None:
    slos = SloSpec.model_validate({"budgets": {"gpu-fatal": {"detectSeconds": 60, "recoverSeconds": 600}}})
    assert health_check_interval_seconds(slos) == 15
    config = npd_plugin_config(slos)
    (rule,) = config["rules"]
    assert rule["path"] == "/bin/sh" and rule["args"] == ["/custom-config/gpufleet-node-health.sh"]
    assert config["pluginConfig"]["invoke_interval"] == "15s"
    assert health_check_interval_seconds(SloSpec()) == 60
