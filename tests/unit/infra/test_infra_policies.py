"""The policy pack's checks, called directly with fake resource inputs (as `pulumi preview
--policy-pack` would hand them over)."""

from __future__ import annotations

from infra_testdata import load_policies

P = load_policies()
RELEASE = "kubernetes:helm.sh/v3:Release"


def test_chart_pinned() -> None:
    assert P.chart_pinned(RELEASE, {"chart": "volcano", "version": "1.12.1"}) == []
    for bad in (None, "", "*", "^1.2.0", "~1.2", ">=1.0", "1.x", "latest"):
        assert P.chart_pinned(RELEASE, {"chart": "volcano", "version": bad}), bad
    assert P.chart_pinned("kubernetes:core/v1:ConfigMap", {}) == []


def test_nic_policy_not_a_hook() -> None:
    t = "kubernetes:mellanox.com/v1alpha1:NicClusterPolicy"
    assert P.nic_policy_not_a_hook(t, {"metadata": {"name": "nic-cluster-policy"}}) == []
    hooked = {"metadata": {"annotations": {"helm.sh/hook": "post-install,post-upgrade"}}}
    assert P.nic_policy_not_a_hook(t, hooked)


def _node(labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, object]:
    return {
        "metadata": {"name": "n0", "labels": {"gpufleet.io/pool": "p", **labels}},
        "spec": {"taints": taints},
    }


H100 = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "nvidia.com/gpu.count": "8",
}
TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def test_gpu_node_tainted_and_labelled() -> None:
    check = P.gpu_node_tainted_and_labelled
    t = "kubernetes:core/v1:NodePatch"
    assert check(t, _node(H100, [TAINT])) == []
    assert any("not tainted" in m for m in check(t, _node(H100, [])))
    assert any("not tainted" in m for m in check(t, _node(H100, [{**TAINT, "effect": "PreferNoSchedule"}])))
    no_count = {k: v for k, v in H100.items() if k != "nvidia.com/gpu.count"}
    assert any("gpu.count" in m for m in check(t, _node(no_count, [TAINT])))
    assert check(t, _node({}, [TAINT])) and "vendor" in check(t, _node({}, [TAINT]))[0]
    amd = {"feature.node.kubernetes.io/amd-gpu": "true"}
    assert check(t, _node(amd, [{"key": "amd.com/gpu", "effect": "NoSchedule"}])) == []
    assert check(t, _node(amd, [TAINT]))  # an NVIDIA taint does not keep pods off an AMD node
    # Nodes that are not GPU pool nodes of ours are not judged.
    assert check(t, {"metadata": {"name": "cpu-1", "labels": {}}}) == []
    pool = {
        "spec": {
            "template": {"metadata": {"labels": {"gpufleet.io/pool": "p", **H100}}, "spec": {"taints": []}}
        }
    }
    assert check("kubernetes:karpenter.sh/v1:NodePool", pool)


def test_credentials_only_in_secrets() -> None:
    check = P.credentials_only_in_secrets
    assert check("kubernetes:core/v1:ConfigMap", {"data": {"NCCL_IB_HCA": "mlx5"}}) == []
    assert check("kubernetes:core/v1:ConfigMap", {"data": {"metaurl": "redis://x"}})
    assert check("kubernetes:storage.k8s.io/v1:StorageClass", {"parameters": {"secret-key": "abc"}})
    # Names the pack used to miss are credentials now (issue 13).
    assert check(RELEASE, {"values": {"grafana": {"adminPassword": "x"}}})
    assert check(RELEASE, {"values": {"s3": {"secret_key": "x"}}})
    assert check(RELEASE, {"values": {"s3": {"secretAccessKey": "y"}}})
    assert check(RELEASE, {"values": {"receivers": [{"pagerduty_configs": [{"routing_key": "r"}]}]}})
    assert check(RELEASE, {"values": {"slack": {"webhook_url": "https://example.invalid/x"}}})
    assert check(RELEASE, {"values": {"grafana": {"admin": {"password": "x"}}}})
    # Values as well as names: a password inside a URL, key-shaped strings, webhook URLs.
    assert check("kubernetes:core/v1:ConfigMap", {"data": {"bucket": "s3://AK:hunter2@host/b"}})
    assert check("kubernetes:core/v1:ConfigMap", {"data": {"note": "key AKIAABCDEFGHIJKLMNOP"}})
    assert check(RELEASE, {"values": {"api_url": "https://hooks.slack.com/services/T0/B0/x"}})
    env = {"containers": [{"env": [{"name": "DB_PASSWORD", "value": "x"}]}]}
    assert check("kubernetes:apps/v1:Deployment", {"spec": {"template": {"spec": env}}})
    # A reference to a credential is not one; a URL without a password is fine.
    ref = {"existingSecret": "grafana-admin", "userKey": "admin-user", "passwordKey": "admin-password"}
    assert check(RELEASE, {"values": {"grafana": {"admin": ref}}}) == []
    assert check("kubernetes:core/v1:ConfigMap", {"data": {"bucket": "https://user@host/b"}}) == []
    assert check("kubernetes:core/v1:Secret", {"stringData": {"metaurl": "redis://x"}}) == []


def test_gameday_role_least_privilege() -> None:
    t = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
    good = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    meta = {"name": "gpufleet-gameday"}
    assert P.gameday_role_least_privilege(t, {"metadata": meta, "rules": good}) == []
    wildcard = [*good, {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}]
    assert "game-day role can get secrets" in P.gameday_role_least_privilege(
        t, {"metadata": meta, "rules": wildcard}
    )
    assert any(
        "lacks create" in m for m in P.gameday_role_least_privilege(t, {"metadata": meta, "rules": good[:2]})
    )
    assert P.gameday_role_least_privilege(t, {"metadata": {"name": "other"}, "rules": wildcard}) == []


def _env_map(data: dict[str, str], fabric: str) -> tuple[str, dict[str, object]]:
    meta = {"name": "collective-env-nvidia", "labels": {"gpufleet.io/fabric": fabric}}
    return "kubernetes:core/v1:ConfigMap", {"metadata": meta, "data": data}


def test_nccl_env_matches_fabric() -> None:
    check = P.nccl_env_matches_fabric
    nic = ("kubernetes:mellanox.com/v1alpha1:NicClusterPolicy", {"spec": {}})
    efa = (RELEASE, {"name": "aws-efa-k8s-device-plugin"})
    assert check([nic, _env_map({"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}, "roce")]) == []
    assert any("GID" in m for m in check([nic, _env_map({"NCCL_IB_HCA": "mlx5"}, "roce")]))
    assert check([nic, _env_map({"NCCL_IB_HCA": "mlx5"}, "infiniband")]) == []
    assert any("NCCL_IB_HCA" in m for m in check([nic, _env_map({}, "infiniband")]))
    assert any("NicClusterPolicy" in m for m in check([_env_map({"NCCL_IB_HCA": "mlx5"}, "infiniband")]))
    assert any("FI_PROVIDER" in m for m in check([efa, _env_map({"NCCL_SOCKET_IFNAME": "eth0"}, "efa")]))
    assert check([efa, _env_map({"FI_PROVIDER": "efa"}, "efa")]) == []
    assert any("EFA device plugin is not" in m for m in check([_env_map({"FI_PROVIDER": "efa"}, "efa")]))
    assert any("label" in m for m in check([efa, _env_map({"FI_PROVIDER": "efa"}, "tcp")]))
    assert check([(RELEASE, {"name": "network-operator"})])  # operator without its policy
