"""Every shipped stack, run through the Pulumi program under the mock runtime: the invariants the
policy pack also states for real `pulumi preview` runs."""

from __future__ import annotations

import json

import pytest
from infra_testdata import STACK_NAMES, load_policies, shipped

from gpufleet.config import (
    FabricKind,
    FabricMode,
    SchedulerKind,
    Vendor,
    accelerator_spec,
    collective_environment,
)
from gpufleet.config.placement import POOL_LABEL, ROLE_LABEL, TOPOLOGY_LABELS, leaf_groups, owns_nodes
from gpufleet.core.inspect_contract import own_node_policy
from gpufleet.infra.charts import CHARTS
from gpufleet.infra.gameday import rules_allow
from gpufleet.infra.offline import SECRET_MARK
from gpufleet.infra.platform import backups_of, vendors

NODE_PATCH = "kubernetes:core/v1:NodePatch"
RELEASE = "kubernetes:helm.sh/v3:Release"
NIC_POLICY = "kubernetes:mellanox.com/v1alpha1:NicClusterPolicy"


def test_all_six_issue_stacks_are_shipped() -> None:
    assert {"sandbox", "h200-ib", "b200-roce", "mi300x-roce", "ascend-910b-roce", "scale-10k"} <= set(
        STACK_NAMES
    )


def test_scale_stack_is_at_scale() -> None:
    spec, _ = shipped("scale-10k")
    assert spec.total_nodes >= 1250 and spec.total_gpus >= 10_000


def test_every_gpu_node_is_labelled_and_tainted(stack) -> None:
    _, spec, view = stack
    patches = {r.inputs["metadata"]["name"]: r.inputs for r in view.of_type(NODE_PATCH)}
    storage_nodes = {n.name for n in spec.storage.ceph.storage_nodes} if spec.storage.ceph else set()
    patches = {k: v for k, v in patches.items() if k not in storage_nodes}
    expected_nodes = sum(p.total_nodes for p in spec.node_pools if owns_nodes(p))
    assert len(patches) == expected_nodes
    for pool in spec.node_pools:
        acc = accelerator_spec(pool.accelerator)
        names = pool.node_names()
        for index, node in enumerate(names):
            patch = patches[node]
            labels = patch["metadata"]["labels"]
            for k, v in acc.node_labels.items():
                assert labels[k] == v, (node, k)
            assert labels[POOL_LABEL] == pool.name
            assert labels[ROLE_LABEL] == ("spare" if index >= pool.nodes else "compute")
            assert set(TOPOLOGY_LABELS) <= set(labels)
            for k, v in pool.labels.items():
                assert labels[k] == v
            taints = patch["spec"]["taints"]
            assert any(t["key"] == acc.resource_name and t["effect"] == "NoSchedule" for t in taints), node
            for declared in pool.taints:
                assert {"key": declared.key, "effect": declared.effect.value}.items() <= next(
                    t for t in taints if t["key"] == declared.key
                ).items()
        # Racks and leaf groups follow the declared topology: no leaf holds more than nodesPerLeaf.
        tors = [patches[n]["metadata"]["labels"]["gpufleet.io/leaf"] for n in names]
        assert max(tors.count(t) for t in set(tors)) <= pool.topology.nodes_per_leaf


def test_nccl_environment_matches_the_fabric(stack) -> None:
    _, spec, view = stack
    maps = {
        r.inputs["metadata"]["name"]: r.inputs["data"]
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
        if r.inputs["metadata"]["name"].startswith("collective-env-")
    }
    assert set(maps) == {f"collective-env-{v.value}" for v in vendors(spec)}
    for vendor in vendors(spec):
        env = maps[f"collective-env-{vendor.value}"]
        assert env == collective_environment(spec.fabric, vendor)
        assert view.outputs["ncclEnv"][vendor.value] == env
        if vendor.value == "huawei":
            assert env["HCCL_SOCKET_IFNAME"] == spec.fabric.mgmt_interface
            continue
        assert env["NCCL_SOCKET_IFNAME"] == spec.fabric.mgmt_interface
        if spec.fabric.kind is FabricKind.ROCE:
            assert env["NCCL_IB_GID_INDEX"] == str(spec.fabric.gid_index)
        if spec.fabric.kind in (FabricKind.ROCE, FabricKind.INFINIBAND):
            assert env["NCCL_IB_HCA"]
        if spec.fabric.kind is FabricKind.INFINIBAND:
            assert "NCCL_IB_GID_INDEX" not in env


def test_secrets_are_secret(stack) -> None:
    _, spec, view = stack
    secrets = view.of_type("kubernetes:core/v1:Secret")
    for grafana in [s for s in secrets if s.inputs["metadata"]["name"] == "grafana-admin"]:
        assert grafana.inputs["stringData"] == SECRET_MARK
    secrets = [s for s in secrets if s.inputs["metadata"]["name"] != "grafana-admin"]
    if spec.storage.juicefs is None:
        assert secrets == []
        return
    # The JuiceFS CSI Secret, and on a cluster stack with backups as code their copy (ADR 0060).
    assert len(secrets) == (2 if backups_of(spec) is not None else 1)
    for secret in secrets:
        # The mock monitor received the credentials wrapped as Pulumi secrets.
        assert secret.secret_paths and all(p.startswith("stringData") for p in secret.secret_paths)
        assert secret.inputs["stringData"] == SECRET_MARK
    # No ciphertext or credential appears in any other resource's inputs.
    dump = json.dumps([r.inputs for r in view.resources if r not in secrets])
    js = spec.storage.juicefs
    for s in (js.meta_url, js.access_key, js.secret_key):
        if s is not None and s.secure:
            assert s.secure not in dump


def test_no_chart_is_unpinned(stack) -> None:
    _, _, view = stack
    releases = view.of_type(RELEASE)
    assert releases
    for r in releases:
        ref = CHARTS[r.inputs["name"]]
        assert r.inputs["version"] == ref.version and r.inputs["chart"] == ref.chart
        assert load_policies().chart_pinned(RELEASE, r.inputs) == []


def test_gameday_cronjob_runs_under_a_role_that_cannot_read_secrets(stack) -> None:
    name, spec, view = stack
    (role,) = [
        r
        for r in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
        if r.inputs["metadata"]["name"] == "gpufleet-gameday"
    ]
    rules = role.inputs["rules"]
    for verb in ("get", "list", "watch"):
        assert not rules_allow(rules, verb, "secrets")
    assert rules_allow(rules, "patch", "nodes") and rules_allow(rules, "list", "nodes")
    assert rules_allow(rules, "create", "pods/eviction") and rules_allow(rules, "get", "pods")
    assert not rules_allow(rules, "delete", "nodes") and not rules_allow(rules, "create", "pods")
    assert rules_allow(rules, "get", "jobs", "batch")  # the training Job's parallelism
    # Fault pods only in the game-day namespace (created there, deleted by their rollbacks).
    (pods_role,) = [r for r in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
                    if r.inputs["metadata"]["name"] == "gpufleet-gameday-fault-pods"]
    ns_rules = pods_role.inputs["rules"]
    assert ns_rules[0] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}
    # The fault ledger's ConfigMap (it outlives the pod): created, then read and patched by name only.
    assert rules_allow(ns_rules, "create", "configmaps")
    for verb in ("get", "patch"):
        assert rules_allow(ns_rules, verb, "configmaps", name="gpufleet-fault-ledger")
        assert not rules_allow(ns_rules, verb, "configmaps", name="gpufleet-stack")
    assert not any(rules_allow(ns_rules, v, "configmaps") for v in ("list", "delete", "update"))
    (binding,) = [
        b
        for b in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
        if b.inputs["roleRef"]["name"] == "gpufleet-gameday"
    ]
    assert binding.inputs["roleRef"]["name"] == role.inputs["metadata"]["name"]
    (cron,) = [  # beside the backup CronJobs of a stack with dr (ADR 0060)
        c
        for c in view.of_type("kubernetes:batch/v1:CronJob")
        if c.inputs["metadata"]["name"] == "gpufleet-gameday"
    ]
    pod = cron.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert cron.inputs["spec"]["schedule"] == spec.gameday.schedule
    assert pod["serviceAccountName"] == binding.inputs["subjects"][0]["name"]
    assert pod["containers"][0]["command"] == [
        "gpufleet",
        "gameday",
        "--stack",
        name,
        "--backend",
        "kubernetes",
    ]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["GPUFLEET_LEDGER"] == f"configmap://{spec.gameday.namespace}/gpufleet-fault-ledger"


def test_nic_cluster_policy_is_a_cr_not_a_hook(stack) -> None:
    _, spec, view = stack
    policies = view.of_type(NIC_POLICY)
    if spec.fabric.kind is FabricKind.EFA or vendors(spec) == {Vendor.HUAWEI}:
        assert policies == []  # no ConnectX NICs for the Network Operator to manage
        return
    (policy,) = policies
    assert policy.custom and policy.inputs["metadata"]["name"] == "nic-cluster-policy"
    assert not any(k.startswith("helm.sh/hook") for k in policy.inputs["metadata"].get("annotations", {}))
    # Not rendered by the chart either: the Network Operator release carries no CR values.
    (operator,) = [r for r in view.of_type(RELEASE) if r.inputs["name"] == "network-operator"]
    assert "nicClusterPolicy" not in json.dumps(operator.inputs["values"])
    section = {
        FabricMode.RDMA_SHARED: "rdmaSharedDevicePlugin",
        FabricMode.SRIOV: "sriovDevicePlugin",
        FabricMode.IPOIB: "secondaryNetwork",
    }[spec.fabric.mode]
    assert section in policy.inputs["spec"]


def test_resource_counts_grow_only_with_nodes(stack) -> None:
    _, spec, view = stack
    counts = view.by_type()
    named = [p for p in spec.node_pools if owns_nodes(p)]
    storage_nodes = len(spec.storage.ceph.storage_nodes) if spec.storage.ceph else 0
    assert counts[NODE_PATCH] == sum(p.total_nodes for p in named) + storage_nodes
    hypernodes = counts.get("kubernetes:topology.volcano.sh/v1alpha1:HyperNode", 0)
    if spec.scheduler.kind is SchedulerKind.VOLCANO:
        assert hypernodes == sum(len(leaf_groups(p)) + 1 for p in named)
    else:
        assert hypernodes == 0
    # Everything else is per stack (charts, CRs, RBAC, rules, admission policies): a few dozen at
    # most, at any scale.
    assert len(view.custom()) - counts[NODE_PATCH] - hypernodes <= 64
    # Every resource sits inside a component.
    assert all(view.component_of(r) is not None for r in view.custom())


def test_outputs_carry_capacity_and_slos(stack) -> None:
    _, spec, view = stack
    out = view.outputs
    assert out["gpus"] == spec.total_gpus and out["nodes"] == spec.total_nodes
    assert out["peakBf16Pflops"] == pytest.approx(spec.peak_bf16_pflops, abs=1e-3)
    assert out["slos"] == spec.slos.model_dump(mode="json", by_alias=True)
    assert out["fabric"]["kind"] == spec.fabric.kind.value
    assert out["alerts"] > 0


def test_policy_pack_passes_on_the_program_output(stack) -> None:
    _, _, view = stack
    policies = load_policies()
    for r in view.custom():
        for name, check in policies.RESOURCE_POLICIES.items():
            assert check(r.type, r.inputs) == [], (name, r.urn)
    assert policies.nccl_env_matches_fabric([(r.type, r.inputs) for r in view.custom()]) == []


def test_every_nvidia_node_publishes_its_inspection_under_a_writer_of_configmaps_only(stack) -> None:
    """infra.fleet_inspect: a DaemonSet per NVIDIA pool runs `gpufleet inspect --here --publish` on
    its nodes; its ServiceAccount may write ConfigMaps in the inspect namespace and nothing else."""
    name, spec, view = stack
    nvidia = [p.name for p in spec.node_pools if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA]
    daemonsets = {d.inputs["metadata"]["name"]: d for d in view.of_type("kubernetes:apps/v1:DaemonSet")
                  if d.inputs["metadata"]["name"].startswith("gpufleet-inspect-")}
    assert sorted(daemonsets) == sorted(f"gpufleet-inspect-{p}" for p in nvidia)
    for pool in nvidia:
        ds = daemonsets[f"gpufleet-inspect-{pool}"]
        assert ds.inputs["metadata"]["namespace"] == "gpufleet-system"
        # The upgrade gate finds the publisher by this label, on the DaemonSet and on its pods.
        for labels in (ds.inputs["metadata"]["labels"], ds.inputs["spec"]["template"]["metadata"]["labels"]):
            assert labels["app.kubernetes.io/name"] == "gpufleet-inspect"
        pod = ds.inputs["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {POOL_LABEL: pool}
        assert pod["serviceAccountName"] == "gpufleet-inspect" and pod["hostNetwork"] is True
        (c,) = pod["containers"]
        assert c["image"] == spec.gameday.image
        loop = c["command"][-1]
        assert f"gpufleet inspect --here --publish --stack {name} --pool {pool} " in loop
        assert "sleep 300" in loop
        assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
        assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
        assert "resources" in c and "nvidia.com/gpu" not in c["resources"].get("requests", {})  # no GPU held
        (stack_cm,) = [m for m in view.of_type("kubernetes:core/v1:ConfigMap")
                       if m.inputs["metadata"]["name"] == pod["volumes"][0]["configMap"]["name"]]
        assert SECRET_MARK not in json.dumps(stack_cm.inputs["data"])
    if not nvidia:
        return
    (role,) = [r for r in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
               if r.inputs["metadata"]["name"] == "gpufleet-inspect"]
    assert role.inputs["metadata"]["namespace"] == "gpufleet-inspect"
    rules = role.inputs["rules"]
    assert rules_allow(rules, "create", "configmaps") and rules_allow(rules, "update", "configmaps")
    for verb in ("get", "list", "delete", "patch"):
        assert not rules_allow(rules, verb, "configmaps")
    assert not rules_allow(rules, "get", "secrets") and not rules_allow(rules, "patch", "nodes")
    (binding,) = [b for b in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
                  if b.inputs["metadata"]["name"] == "gpufleet-inspect"]
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-inspect",
                                           "namespace": "gpufleet-system"}]
    # ... and only its own node's ConfigMap (ADR 0077): the admission policy the sandbox applies too.
    policy_want, binding_want = own_node_policy()
    (vap,) = view.of_type("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
    assert vap.inputs["metadata"]["name"] == "gpufleet-inspect-own-node"
    assert vap.inputs["spec"] == policy_want["spec"]
    assert vap.inputs["spec"]["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:gpufleet-system:gpufleet-inspect'")
    (vapb,) = view.of_type("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
    assert vapb.inputs["spec"] == binding_want["spec"] == {"policyName": "gpufleet-inspect-own-node",
                                                          "validationActions": ["Deny"]}
    assert vap.urn in vapb.dependencies
