"""The GPU Operator's objects in the Kubernetes sandbox (pure): its identity from the generated
ClusterRole, the ClusterPolicy with the stack's upgrade policy, and the driver and validator
DaemonSets in the shape its upgrade controller acts on."""

from __future__ import annotations

from pathlib import Path

from gpufleet.config import load_named_stack
from gpufleet.config.gpu_operator import KUEUE_QUEUE_LABEL, driver_upgrade_policy, pinned_driver
from gpufleet.config.model import UpgradeSpec
from gpufleet.sandbox.kube import gpu_operator as G

STACKS = Path(__file__).parents[3] / "stacks"


def test_the_cluster_policy_carries_the_stacks_upgrade_policy() -> None:
    spec = load_named_stack("sandbox", STACKS)
    cp = G.cluster_policy(spec, 5)
    driver = cp["spec"]["driver"]
    assert driver["version"] == "550.90.07" == pinned_driver(spec)  # the pool's pin
    policy = driver["upgradePolicy"]
    # The sandbox stack: waveSize 1, maxUnavailable 1, drainTimeoutSeconds 60.
    assert (policy["autoUpgrade"], policy["maxParallelUpgrades"], policy["maxUnavailable"]) == (True, 1, 1)
    assert policy["podDeletion"] == {"force": False, "timeoutSeconds": 60, "deleteEmptyDir": False}
    assert policy["drain"]["timeoutSeconds"] == 60 and policy["drain"]["enable"] is True
    # Every section the CRD requires; nothing but the driver enabled on kwok nodes.
    required = {"operator", "daemonsets", "dcgm", "dcgmExporter", "devicePlugin", "driver", "gfd",
                "nodeStatusExporter", "toolkit"}
    assert required <= set(cp["spec"])
    assert [k for k, v in cp["spec"].items() if isinstance(v, dict) and v.get("enabled")] == ["driver"]


def test_upgrade_policy_of_a_percentage_and_protected_queues() -> None:
    spec = UpgradeSpec.model_validate({"waveSize": "10%", "maxUnavailable": "5%", "drainTimeoutSeconds": 900,
                                       "protectedJobs": {"queues": ["prod", "eval"]}})
    policy = driver_upgrade_policy(spec, 1250)
    assert policy["maxParallelUpgrades"] == 125 and policy["maxUnavailable"] == "5%"
    assert policy["waitForCompletion"] == {"podSelector": f"{KUEUE_QUEUE_LABEL} in (eval,prod)",
                                           "timeoutSeconds": 3600}
    assert "waitForCompletion" not in driver_upgrade_policy(UpgradeSpec(), 10)


def test_the_driver_daemonset_is_what_the_upgrade_controller_acts_on() -> None:
    ds = G.driver_daemonset("570.124.06", "uid-1", fails_to_load=False)
    assert ds["metadata"]["namespace"] == G.NAMESPACE
    assert ds["metadata"]["labels"]["app"] == "nvidia-driver-daemonset"
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == "nvidia-driver-daemonset"
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    # Owned by the ClusterPolicy: the controller watches only the DaemonSets it owns.
    assert ds["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"
    assert ds["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.deploy.driver": "true"}
    pod = {"spec": ds["spec"]["template"]["spec"]}
    assert G.driver_version(pod) == "570.124.06"
    assert ds["spec"]["template"]["metadata"]["annotations"] == {}
    bad = G.driver_daemonset("560.0.0-bad", "uid-1", fails_to_load=True)
    assert bad["spec"]["template"]["metadata"]["annotations"] == {G.FAILS_TO_LOAD: "true"}
    validator = G.validator_daemonset("uid-1")
    assert validator["spec"]["selector"]["matchLabels"] == {"app": "nvidia-operator-validator"}


def test_identity_binds_the_generated_role() -> None:
    rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "gpufleet-gpu-operator"}, "rules": rules}
    ns, sa, cr, crb = G.identity_objects(role)
    assert ns["metadata"]["name"] == G.NAMESPACE and sa["metadata"]["name"] == G.SERVICE_ACCOUNT
    assert cr["rules"] == role["rules"]
    sa_ref = {"kind": "ServiceAccount", "name": G.SERVICE_ACCOUNT, "namespace": G.NAMESPACE}
    assert crb["subjects"] == [sa_ref]
    assert crb["roleRef"]["name"] == "gpufleet-gpu-operator"


def test_nvidia_nodes_are_declared_skipped_by_the_operator() -> None:
    """Every NVIDIA node carries the upgrade controller's skip label from the start (node patches,
    Karpenter pools, the sandbox's kwok nodes): the operator upgrades only what a rollout hands it."""
    from gpufleet.config.gpu_operator import UPGRADE_SKIP_LABEL
    from gpufleet.config.placement import node_labels, pool_labels

    nvidia = load_named_stack("sandbox", STACKS).node_pools[0]
    amd = load_named_stack("sandbox-mi300x", STACKS).node_pools[0]
    assert node_labels(nvidia, 0)[UPGRADE_SKIP_LABEL] == "true" == pool_labels(nvidia)[UPGRADE_SKIP_LABEL]
    assert UPGRADE_SKIP_LABEL not in node_labels(amd, 0)


def test_the_operator_runs_by_default_on_small_sandboxes_only() -> None:
    """Its first pass costs 1.6 s at 6 nodes and 262 s at 1,250: above 200 nodes it runs when asked."""
    from gpufleet.sandbox.kube.cluster import GPU_OPERATOR_MAX_NODES, KubeUpOptions, wants_gpu_operator

    nvidia = load_named_stack("sandbox", STACKS)
    amd = load_named_stack("sandbox-mi300x", STACKS)
    assert GPU_OPERATOR_MAX_NODES == 200
    assert wants_gpu_operator(KubeUpOptions(), nvidia, 6)
    assert not wants_gpu_operator(KubeUpOptions(), nvidia, 1250)
    assert wants_gpu_operator(KubeUpOptions(gpu_operator=True), nvidia, 1250)
    assert not wants_gpu_operator(KubeUpOptions(gpu_operator=False), nvidia, 6)
    assert not wants_gpu_operator(KubeUpOptions(gpu_operator=True), amd, 6)  # no NVIDIA pool
    assert not wants_gpu_operator(KubeUpOptions(platform=False), nvidia, 6)  # --cluster-only
