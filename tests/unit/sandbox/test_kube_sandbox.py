"""The Kubernetes sandbox's pure parts (gpufleet.sandbox.kube): certificates, kubeconfigs, daemon
argv, kwok's configuration, nodes from a stack, RBAC held to the chaos backend's calls, the training
workload, the state file, and `down` after a crash. No API server needed (tests/e2e has that)."""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import ipaddress
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from gpufleet.chaos.backends import kube_ledger
from gpufleet.chaos.backends import kubernetes as chaos_k8s
from gpufleet.cli import sandbox_cmds
from gpufleet.cli.main import app
from gpufleet.config import load_named_stack
from gpufleet.config.model import StackSpec
from gpufleet.config.placement import LEAF_LABEL, POOL_LABEL, ROLE_LABEL
from gpufleet.core.errors import InputError
from gpufleet.core.procs import launch
from gpufleet.core.sandbox_contract import (
    KUBE_SPARE_LABEL,
    KubeSandboxState,
    Launch,
    SandboxProcess,
    kube_state_path,
    read_kube_state,
    state_path,
    write_kube_state,
)
from gpufleet.infra.scheduler import QUEUE_NAMESPACE
from gpufleet.sandbox.down import all_stacks
from gpufleet.sandbox.kube import daemons, kubelet_node, kwok_config, nodes, pki, rbac, workload
from gpufleet.sandbox.kube.cluster import KubeUpOptions, all_kube_stacks, existing_kube, kube_down, kube_up
from gpufleet.sandbox.kube.kubeconfig import kubeconfig

STACKS = Path(__file__).parents[3] / "stacks"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def sandbox_spec() -> StackSpec:
    return load_named_stack("sandbox", STACKS)


@pytest.fixture(scope="module")
def scale_spec() -> StackSpec:
    return load_named_stack("scale-10k", STACKS)


# ----------------------------------------------------------------------------- certificates


@pytest.fixture(scope="module")
def ca() -> pki.KeyPair:
    return pki.new_ca("test-ca", NOW)


def _cert(pair: pki.KeyPair) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pair.cert_pem)


def _spec(name: str) -> pki.CertSpec:
    return next(s for s in pki.certificate_plan() if s.name == name)


def test_apiserver_serving_certificate_names_loopback_and_the_kubernetes_service(ca: pki.KeyPair) -> None:
    cert = _cert(pki.issue(ca, _spec("apiserver"), NOW))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address(pki.KUBERNETES_SERVICE_IP),
    }
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    cert.verify_directly_issued_by(_cert(ca))
    assert ipaddress.ip_address(pki.KUBERNETES_SERVICE_IP) in ipaddress.ip_network(daemons.SERVICE_CIDR)


@pytest.mark.parametrize(
    ("name", "cn", "orgs"),
    [
        ("admin", "gpufleet-admin", ["system:masters"]),
        ("controller-manager", "system:kube-controller-manager", []),
        ("scheduler", "system:kube-scheduler", []),
        ("kwok", "gpufleet:kwok", []),
        ("apiserver-etcd-client", "kube-apiserver-etcd-client", []),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []),
    ],
)
def test_client_certificates_carry_the_user_and_groups_rbac_binds(
    ca: pki.KeyPair, name: str, cn: str, orgs: list[str]
) -> None:
    cert = _cert(pki.issue(ca, _spec(name), NOW))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [cn]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == orgs
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_only_the_admin_is_in_system_masters() -> None:
    masters = [s.name for s in pki.certificate_plan() if pki.MASTERS_GROUP in s.organizations]
    assert masters == ["admin"]


def test_ca_is_a_ca_and_certificates_expire(ca: pki.KeyPair) -> None:
    cert = _cert(ca)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf = _cert(pki.issue(ca, _spec("admin"), NOW))
    assert leaf.not_valid_after_utc - NOW == dt.timedelta(days=pki.VALID_DAYS)


def test_write_pki_keeps_private_keys_private(tmp_path: Path) -> None:
    p = pki.Pki(tmp_path / "pki")
    pki.write_pki(p, "test", NOW)
    assert (p.dir.stat().st_mode & 0o777) == 0o700
    for key in [p.ca_key, p.sa_key, *(p.key(s.name) for s in pki.certificate_plan())]:
        assert (key.stat().st_mode & 0o777) == 0o600, key
    assert p.sa_pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")


# ----------------------------------------------------------------------------- kubeconfig, daemons


def test_kubeconfig_takes_exactly_one_credential(tmp_path: Path) -> None:
    cfg = kubeconfig("https://127.0.0.1:1", tmp_path / "ca.crt", "u", token="t", namespace="ns")
    assert cfg["users"] == [{"name": "u", "user": {"token": "t"}}]
    assert cfg["contexts"][0]["context"] == {"cluster": "gpufleet-sandbox", "user": "u", "namespace": "ns"}
    assert cfg["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "ca.crt")
    with pytest.raises(ValueError, match="exactly one"):
        kubeconfig("https://x", tmp_path, "u")
    with pytest.raises(ValueError, match="its key"):
        kubeconfig("https://x", tmp_path, "u", client_cert=tmp_path / "c")


@pytest.fixture
def layout(tmp_path: Path) -> daemons.KubeLayout:
    ports = {name: 20000 + i for i, name in enumerate(daemons.PORT_NAMES)}
    return daemons.KubeLayout("s", "abc123", tmp_path / "run-abc123", ports)


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv[1:])


def test_apiserver_argv(layout: daemons.KubeLayout) -> None:
    f = _flags(daemons.apiserver_argv(Path("/bin/kube-apiserver"), layout))
    assert f["authorization-mode"] == "Node,RBAC"
    assert f["bind-address"] == "127.0.0.1"
    assert f["secure-port"] == str(layout.ports["kube-apiserver"])
    assert f["anonymous-auth"] == "false"
    assert f["service-account-key-file"].endswith("pki/sa.pub")
    assert f["service-account-signing-key-file"].endswith("pki/sa.key")
    assert f["service-account-issuer"] == layout.api_url
    assert f["client-ca-file"] == f["etcd-cafile"] == str(layout.pki.ca_cert)
    assert f["etcd-servers"] == f"https://127.0.0.1:{layout.ports['etcd-client']}"
    assert f["etcd-certfile"].endswith("apiserver-etcd-client.crt")
    # Pod logs and exec on kubelet nodes: dialled at InternalIP only (never a name the machine's DNS
    # would be asked about), as a client of the run's CA, the kubelet's certificate checked.
    assert f["kubelet-preferred-address-types"] == "InternalIP"
    assert f["kubelet-client-certificate"].endswith("apiserver-kubelet-client.crt")
    assert f["kubelet-certificate-authority"] == str(layout.pki.ca_cert)


def test_the_kubelet_client_may_use_the_kubelet_api_and_nothing_else() -> None:
    (binding,) = rbac.kubelet_api_objects()
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"]["name"] == "system:kubelet-api-admin"
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": pki.KUBELET_CLIENT_USER}]


def test_etcd_requires_client_certificates_on_loopback(layout: daemons.KubeLayout) -> None:
    f = _flags(daemons.etcd_argv(Path("/bin/etcd"), layout))
    assert f["client-cert-auth"] == f["peer-client-cert-auth"] == "true"
    assert f["listen-client-urls"].startswith("https://127.0.0.1:")
    assert f["listen-peer-urls"].startswith("https://127.0.0.1:")
    assert f["data-dir"] == str(layout.etcd_dir)


def test_controller_manager_and_scheduler_argv(layout: daemons.KubeLayout) -> None:
    kcm = _flags(daemons.controller_manager_argv(Path("/bin/kube-controller-manager"), layout))
    assert kcm["use-service-account-credentials"] == "true"
    assert kcm["root-ca-file"] == str(layout.pki.ca_cert)
    assert kcm["service-account-private-key-file"] == str(layout.pki.sa_key)
    assert kcm["kubeconfig"].endswith("controller-manager.kubeconfig")
    # A lost kubelet is NotReady 20 s after its last Lease renewal (kwok renews every 10 s): within
    # the sandbox stack's 30 s node-crash detection budget.
    assert (kcm["node-monitor-grace-period"], kcm["node-monitor-period"]) == ("20s", "2s")
    large = _flags(daemons.controller_manager_argv(Path("k"), layout, daemons.liveness(1250)))
    assert large["node-monitor-grace-period"] == "50s"  # Kubernetes' default: renewals lag at scale
    for n in (1, 6, 200, 201, 1250, 5000):
        live = daemons.liveness(n)
        assert live.grace_s >= 2 * live.renew_s, n  # one missed renewal never marks a node NotReady
    cfg = next(yaml.safe_load_all(kwok_config.kwok_config_text(daemons.liveness(1250).lease_s)))
    assert cfg["options"]["nodeLeaseDurationSeconds"] == 80
    sched = _flags(daemons.scheduler_argv(Path("/bin/kube-scheduler"), layout))
    assert sched["kubeconfig"].endswith("scheduler.kubeconfig")
    for f in (kcm, sched):
        assert f["bind-address"] == "127.0.0.1"
        assert f["leader-elect"] == "false"
        assert f["client-ca-file"] == str(layout.pki.ca_cert)


def test_kwok_manages_only_annotated_nodes(layout: daemons.KubeLayout) -> None:
    f = _flags(daemons.kwok_argv(Path("/bin/kwok"), layout, kwok_config.NODE_SELECTOR))
    assert f["manage-all-nodes"] == "false"
    assert f["manage-nodes-with-annotation-selector"] == "kwok.x-k8s.io/node=fake"
    assert f["server-address"] == f"127.0.0.1:{layout.ports['kwok']}"
    assert f["config"] == str(layout.kwok_config)


def test_every_daemon_names_the_run_directory(layout: daemons.KubeLayout) -> None:
    """`down` finds a daemon started but not recorded by the run directory in its command line."""
    argvs = [
        daemons.etcd_argv(Path("etcd"), layout),
        daemons.apiserver_argv(Path("kube-apiserver"), layout),
        daemons.controller_manager_argv(Path("kube-controller-manager"), layout),
        daemons.scheduler_argv(Path("kube-scheduler"), layout),
        daemons.kwok_argv(Path("kwok"), layout, "a=b"),
        daemons.kueue_argv(Path("kueue"), layout),
        daemons.gpu_operator_argv(Path("gpu-operator"), layout, as_root=True),
    ]
    # The operator is started through unshare and `sh -c ... exec "$0" "$@"`: its program is $0.
    op = argvs[-1]
    assert op[:5] == ["unshare", "--mount", "--propagation", "private", "sh"]
    programs = [Path(a[0]).name for a in argvs[:-1]] + [Path(op[op.index("-c") + 2]).name]
    assert programs == list(daemons.DAEMONS)
    for argv in argvs:
        assert str(layout.base_dir) in " ".join(argv), argv[0]


def test_the_gpu_operator_gets_an_empty_opt_of_its_own(layout: daemons.KubeLayout) -> None:
    """Its manifests are not taken from its module archive: a private tmpfs over /opt with only the
    folder its NVIDIADriver controller insists on; not root: a user namespace maps the caller."""
    root = daemons.gpu_operator_argv(Path("/c/gpu-operator"), layout, as_root=True)
    script = root[root.index("-c") + 1]
    assert script.startswith("mount -t tmpfs") and " /opt " in script
    assert "mkdir -p /opt/gpu-operator/manifests/state-driver" in script and script.endswith('exec "$0" "$@"')
    assert "--metrics-bind-address=0" in root and "--leader-elect=false" in root
    assert f"--health-probe-bind-address=127.0.0.1:{layout.ports[daemons.GPU_OPERATOR_HEALTH]}" in root
    user = daemons.gpu_operator_argv(Path("/c/gpu-operator"), layout, as_root=False)
    assert user[:5] == ["unshare", "--mount", "--propagation", "private", "--map-root-user"]
    assert layout.healthz_url(daemons.GPU_OPERATOR).endswith("/readyz")


def test_layout_needs_every_port(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no port for"):
        daemons.KubeLayout("s", "abc123", tmp_path, {"etcd-client": 1})


def test_free_ports_are_distinct() -> None:
    ports = daemons.free_ports()
    assert set(ports) == set(daemons.PORT_NAMES)
    assert len(set(ports.values())) == len(ports)


# ----------------------------------------------------------------------------- kwok


def test_kwok_config_is_a_configuration_and_stages() -> None:
    docs = list(yaml.safe_load_all(kwok_config.kwok_config_text()))
    assert docs[0]["kind"] == "KwokConfiguration"
    stages = {d["metadata"]["name"]: d for d in docs[1:]}
    # No node heartbeat Stage: liveness is the Lease, and kwok plays a delayed node Stage even for a
    # node whose Lease it gave up (a crashed node would come back).
    assert set(stages) == {"node-initialize", "pod-ready", "pod-crashloop", "pod-terminate", "pod-delete"}
    assert all(d["kind"] == "Stage" and d["apiVersion"] == "kwok.x-k8s.io/v1alpha1" for d in docs[1:])
    # Training pods never complete on their own; a deleted pod fails first (the Job controller
    # accounts it), then goes once its finalizers are gone.
    assert "phase: Succeeded" not in kwok_config.kwok_config_text()
    delete = stages["pod-delete"]["spec"]
    assert delete["next"] == {"delete": True}
    assert {"key": ".metadata.finalizers", "operator": "DoesNotExist"} in delete["selector"][
        "matchExpressions"
    ]
    assert "phase: Failed" in stages["pod-terminate"]["spec"]["next"]["statusTemplate"]
    assert not any("delay" in d["spec"] for d in stages.values())
    # A driver pod at a bad version crash-loops past the operator's 10 restarts; pod-ready leaves it.
    fails = {"key": '.metadata.annotations["gpufleet.io/driver-fails-to-load"]', "operator": "In",
             "values": ["true"]}
    assert fails in stages["pod-crashloop"]["spec"]["selector"]["matchExpressions"]
    assert "restartCount: 11" in stages["pod-crashloop"]["spec"]["next"]["statusTemplate"]
    ready = stages["pod-ready"]["spec"]["selector"]["matchExpressions"]
    assert {"key": fails["key"], "operator": "DoesNotExist"} in ready
    assert docs[0]["options"]["nodeLeaseDurationSeconds"] == 40


def test_doctor_names_the_build_for_each_missing_program() -> None:
    from gpufleet.sandbox.doctor import kube_binary_checks

    checks = kube_binary_checks([("kwok", "/c/kwok-v0.8.0/bin/kwok")], "make kube-bins")
    assert [(c.name, c.ok, c.fix) for c in checks] == [("kubernetes kwok", False, "make kube-bins")]
    assert "/c/kwok-v0.8.0/bin/kwok" in checks[0].detail
    assert all(c.ok for c in kube_binary_checks([], "make kube-bins"))


# ----------------------------------------------------------------------------- nodes


def test_nodes_of_the_sandbox_stack(sandbox_spec: StackSpec) -> None:
    plan = nodes.plan_nodes(sandbox_spec)
    assert [n.name for n in plan] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert [n.name for n in plan if n.spare] == ["gpu-4"]
    spare = plan[-1].manifest()
    labels = spare["metadata"]["labels"]
    assert labels[KUBE_SPARE_LABEL] == "true" and labels[ROLE_LABEL] == "spare"
    assert KUBE_SPARE_LABEL not in plan[0].labels
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["node.kubernetes.io/instance-type"] == "nvidia-h100-sxm-x8"
    assert labels["topology.kubernetes.io/zone"] == "sandbox-a"
    assert labels[POOL_LABEL] == "gpu"
    assert [n.labels[LEAF_LABEL] for n in plan] == [
        "gpu-leaf-000",
        "gpu-leaf-000",
        "gpu-leaf-001",
        "gpu-leaf-001",
        "gpu-leaf-002",
    ]  # nodesPerLeaf: 2
    assert spare["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert spare["status"]["capacity"] == spare["status"]["allocatable"]
    assert spare["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert spare["status"]["capacity"]["pods"] == "110"
    assert spare["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}


def test_nodes_flag_keeps_the_spare_share(sandbox_spec: StackSpec, scale_spec: StackSpec) -> None:
    six = nodes.plan_nodes(sandbox_spec, 6)
    assert (len(six), sum(n.spare for n in six)) == (6, 1)
    big = nodes.plan_nodes(scale_spec, 1250)  # 1,250 + 30 in the stack: 30/1,280 of 1,250 = 29.3
    assert (len(big), sum(n.spare for n in big)) == (1250, 29)
    assert big[0].name == "h100-0000" and big[-1].name == "h100-1249"
    assert big[0].labels["node.kubernetes.io/instance-type"] == "hgx-h100"  # the pool's own label
    assert big[0].labels[LEAF_LABEL] == "h100-leaf-000" and big[32].labels[LEAF_LABEL] == "h100-leaf-001"
    assert sum(int(n.capacity["nvidia.com/gpu"]) for n in big) == 10_000
    one = nodes.plan_nodes(sandbox_spec, 1)
    assert [(n.name, n.spare) for n in one] == [("gpu-0", False)]


def test_nodes_flag_keeps_the_pools_proportions(sandbox_spec: StackSpec) -> None:
    first = sandbox_spec.node_pools[0]
    second = first.model_copy(update={"name": "big", "nodes": 15, "spares": 0})
    spec = sandbox_spec.model_copy(update={"node_pools": [first, second]})  # 5 and 15 nodes
    plan = nodes.plan_nodes(spec, 10)
    per_pool = {p: sum(n.pool == p for n in plan) for p in ("gpu", "big")}
    assert per_pool == {"gpu": 3, "big": 7}  # 2.5 / 7.5: the tie goes to the first pool
    assert nodes._largest_remainder([1, 1, 1], 5) == [2, 2, 1]


def test_up_refuses_nodes_that_leave_the_training_pool_empty(sandbox_spec: StackSpec, tmp_path: Path) -> None:
    first = sandbox_spec.node_pools[0]
    second = first.model_copy(update={"name": "big", "nodes": 15, "spares": 0})
    spec = sandbox_spec.model_copy(update={"node_pools": [first, second]})
    with pytest.raises(InputError, match="no compute node"):
        kube_up("s", spec, KubeUpOptions(nodes=1), root=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("count", [0, -1, 5001])
def test_nodes_out_of_bounds(sandbox_spec: StackSpec, count: int) -> None:
    with pytest.raises(InputError, match="nodes"):
        nodes.plan_nodes(sandbox_spec, count)


def test_a_stack_bigger_than_the_sandbox_needs_nodes(scale_spec: StackSpec) -> None:
    pool = scale_spec.node_pools[0].model_copy(update={"nodes": 6000})
    with pytest.raises(InputError, match="pass --nodes"):
        nodes.plan_nodes(scale_spec.model_copy(update={"node_pools": [pool]}))


def test_every_accelerator_has_a_host_shape() -> None:
    from gpufleet.config.accelerators import AcceleratorModel

    assert set(nodes.HOSTS) == set(AcceleratorModel)


# ----------------------------------------------------------------------------- RBAC


# Each Kubernetes client call of the chaos backend -> the permission it needs (resource, verb,
# scope). A call added to the backend fails test_chaos_calls_are_all_known until it is listed here
# and granted in rbac.py.
CALLS = {
    "list_node": ("nodes", "list", "cluster"),
    "read_node": ("nodes", "get", "cluster"),
    "patch_node": ("nodes", "patch", "cluster"),
    "patch_node_status": ("nodes/status", "patch", "cluster"),
    "create_namespaced_pod_eviction": ("pods/eviction", "create", "cluster"),
    "create_namespaced_pod": ("pods", "create", "namespace"),
    "delete_namespaced_pod": ("pods", "delete", "namespace"),
    "read_namespaced_lease": ("leases", "get", "node-lease"),
    "patch_namespaced_lease": ("leases", "patch", "node-lease"),
    "list_namespaced_pod": ("pods", "list", "training"),
    "read_namespaced_job": ("jobs", "get", "training"),
    # The fault ledger's ConfigMap (chaos.backends.kube_ledger), in the game-day namespace.
    "create_namespaced_config_map": ("configmaps", "create", "namespace"),
    "read_namespaced_config_map": ("configmaps", "get", "namespace"),
    "patch_namespaced_config_map": ("configmaps", "patch", "namespace"),
}
CLIENTS = ("api", "leases", "batch")  # the backend's CoreV1Api, CoordinationV1Api, BatchV1Api


def _backend_calls() -> set[str]:
    """Every `<client>.<method>` / `self.<client>.<method>` the chaos backend's modules use (the
    backend and its ConfigMap ledger)."""

    def is_api(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id in CLIENTS) or (
            isinstance(node, ast.Attribute) and node.attr in CLIENTS
        )

    return {
        node.attr
        for module in (chaos_k8s, kube_ledger)
        for node in ast.walk(ast.parse(inspect.getsource(module)))
        if isinstance(node, ast.Attribute) and is_api(node.value) and node.attr != "api_client"
    }


def _granted(rules: list[dict[str, list[str]]], scope: str) -> set[tuple[str, str, str]]:
    return {(r, v, scope) for rule in rules for r in rule["resources"] for v in rule["verbs"]}


def test_chaos_calls_are_all_known() -> None:
    assert _backend_calls() == set(CALLS), "add the new call to CALLS and grant it in rbac.py"


def test_chaos_rbac_is_exactly_what_the_backend_calls() -> None:
    scoped = {
        "cluster": rbac.chaos_cluster_rules(), "namespace": rbac.chaos_namespace_rules(),
        "node-lease": rbac.chaos_lease_rules(), "training": rbac.chaos_training_rules(),
    }
    granted = set().union(*(_granted(rules, scope) for scope, rules in scoped.items()))
    assert granted == set(CALLS.values())
    for rule in (r for rules in scoped.values() for r in rules):
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"] + rule["verbs"]
        assert rule["apiGroups"] in ([""], ["coordination.k8s.io"], ["batch"])


def test_chaos_objects_bind_the_service_account() -> None:
    objs = rbac.chaos_objects("gd", "train")
    ns = objs[0]
    assert ns["kind"] == "Namespace" and ns["metadata"]["labels"][rbac.PSA_ENFORCE] == "privileged"
    assert "privileged" in ns["metadata"]["annotations"]["gpufleet.io/privileged-because"]
    sa = {"kind": "ServiceAccount", "name": "gpufleet-chaos", "namespace": "gd"}
    bindings = [o for o in objs if o["kind"].endswith("Binding")]
    assert [b["subjects"] for b in bindings] == [[sa]] * 4
    assert {b["roleRef"]["kind"] for b in bindings} == {"ClusterRole", "Role"}
    roles = {o["metadata"]["namespace"]: o["rules"] for o in objs if o["kind"] == "Role"}
    assert roles == {"gd": rbac.chaos_namespace_rules(), "kube-node-lease": rbac.chaos_lease_rules(),
                     "train": rbac.chaos_training_rules()}


def test_remediation_identity_is_least_privilege() -> None:
    """Nodes read, watched and patched (quarantine, release), pods listed and evicted (drain):
    nothing else, cluster-wide; no secrets, no node status, no deletes."""
    objs = rbac.remediation_objects()
    assert objs[0]["kind"] == "Namespace" and rbac.PSA_ENFORCE not in objs[0]["metadata"]["labels"]
    granted = _granted(rbac.remediation_rules(), "cluster")
    assert granted == {
        ("nodes", "get", "cluster"), ("nodes", "list", "cluster"), ("nodes", "watch", "cluster"),
        ("nodes", "patch", "cluster"), ("pods", "list", "cluster"), ("pods/eviction", "create", "cluster"),
    }
    sa = {"kind": "ServiceAccount", "name": "gpufleet-remediation", "namespace": "gpufleet-system"}
    assert [o["subjects"] for o in objs if o["kind"] == "ClusterRoleBinding"] == [[sa]]


def test_labels_and_namespaces_shared_with_other_layers() -> None:
    assert KUBE_SPARE_LABEL == chaos_k8s.SPARE_LABEL
    assert workload.TRAINING_NAMESPACE == QUEUE_NAMESPACE
    assert (sandbox_cmds.MIN_KUBE_NODES, sandbox_cmds.MAX_KUBE_NODES) == (nodes.MIN_NODES, nodes.MAX_NODES)


# ----------------------------------------------------------------------------- workload


def test_training_job(sandbox_spec: StackSpec) -> None:
    plan = workload.training_plan(sandbox_spec, compute_nodes=4)
    assert plan == workload.TrainingPlan(2, "nvidia.com/gpu", 8, "gpu")  # sandbox.training.nodes: 2
    job = workload.training_job(sandbox_spec, plan)
    spec = job["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == ("Indexed", 2, 2)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule", "operator": "Exists"} in pod["tolerations"]
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"] == [{"type": "DisruptionTarget"}]
    pdb = workload.training_pdb(plan)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert workload.training_plan(sandbox_spec, compute_nodes=1).replicas == 1


# ----------------------------------------------------------------------------- state and down


def _state(root: Path, stack: str = "s", processes: list[SandboxProcess] | None = None) -> KubeSandboxState:
    base = kube_state_path(stack, root).parent / "run-abc123"
    return KubeSandboxState(
        stack=stack,
        run_id="abc123",
        phase="creating",
        base_dir=str(base),
        created_at=time.time(),
        kubernetes_version="v1.37.2",
        processes=processes or [],
    )


def test_state_file_of_its_own(tmp_path: Path) -> None:
    st = _state(tmp_path)
    path = write_kube_state(st, tmp_path)
    assert path == tmp_path / "s" / "kubernetes" / "state.json" != state_path("s", tmp_path)
    assert read_kube_state("s", tmp_path) == st
    assert all_stacks(tmp_path) == []  # the Slurm sandbox's `down --all` does not see it
    assert all_kube_stacks(tmp_path) == ["s"]
    raw = json.loads(path.read_text())
    raw["version"] = 7
    path.write_text(json.dumps(raw))
    state, error = existing_kube("s", tmp_path)
    assert state is None and error is not None and "version 7" in error


def test_down_stops_recorded_and_unrecorded_daemons_and_removes_the_run(tmp_path: Path) -> None:
    """A crash between starting a daemon and recording it: `down` still finds it by the run
    directory in its command line (and only daemons of the sandbox's programs)."""
    st = _state(tmp_path)
    base = Path(st.base_dir)
    (base / "bin").mkdir(parents=True)
    sleep = shutil.which("sleep") or "/bin/sleep"
    fake_etcd = base / "bin" / "etcd"  # a sleep that the kernel names etcd, inside the run directory
    shutil.copy(sleep, fake_etcd)
    shutil.copy(sleep, base / "bin" / "sleep")
    recipe = Launch(program=[str(fake_etcd), "300"], log=str(base / "logs" / "etcd.log"))
    recorded, started = launch(recipe)
    assert started is not None
    stray, _ = launch(recipe.model_copy(update={"log": str(base / "logs" / "stray.log")}))
    bystander = subprocess.Popen([str(base / "bin" / "sleep"), "300"])  # not a sandbox program
    try:
        st.processes.append(SandboxProcess(name="etcd", pid=recorded.pid, start_time=started, launch=recipe))
        write_kube_state(st, tmp_path)
        report = kube_down("s", tmp_path, grace_s=2)
        assert report is not None and report.clean and report.stopped == 2
        recorded.wait(5)
        stray.wait(5)
        assert bystander.poll() is None
        assert not base.exists()
        assert not kube_state_path("s", tmp_path).exists()
        assert not (tmp_path / "s").exists()
        assert kube_down("s", tmp_path) is None  # idempotent
    finally:
        for p in (recorded, stray, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_down_keeps_a_folder_that_is_not_the_runs(tmp_path: Path) -> None:
    st = _state(tmp_path).model_copy(update={"base_dir": str(tmp_path / "elsewhere")})
    (tmp_path / "elsewhere").mkdir()
    write_kube_state(st, tmp_path)
    report = kube_down("s", tmp_path)
    assert report is not None and report.clean
    assert (tmp_path / "elsewhere").is_dir()


# ----------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kubernetes", "--nodes", "0"], "--nodes"),
        (["--kubernetes", "--nodes", "5001"], "--nodes"),
        (["--kubernetes", "--nodes", "many"], "--nodes"),
        (["--nodes", "6"], "add --kubernetes"),
        (["--gpu-operator"], "--gpu-operator is for the Kubernetes sandbox's platform"),
        (["--kubernetes", "--cluster-only", "--no-gpu-operator"], "without --cluster-only"),
    ],
)
def test_cli_refuses_bad_nodes(args: list[str], message: str, tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(tmp_path)}
    result = CliRunner().invoke(app, ["sandbox", "up", "--stacks-dir", str(STACKS), *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) + " ".join((result.stderr or "").split())
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_cli_status_and_down_without_a_kubernetes_sandbox(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(tmp_path)}
    status = CliRunner().invoke(app, ["sandbox", "status", "--kubernetes", "--stack", "x"], env=env)
    assert status.exit_code == 1 and "no Kubernetes sandbox" in " ".join(status.output.split())
    down = CliRunner().invoke(app, ["sandbox", "down", "--kubernetes", "--stack", "x"], env=env)
    assert down.exit_code == 0 and "nothing to do" in down.output


def test_the_state_names_each_kubelet_nodes_agent_where_the_node_keeps_it(tmp_path: Path) -> None:
    state = KubeSandboxState(stack="s", run_id="abc123", phase="up", base_dir=str(tmp_path), created_at=0.0,
                             kubernetes_version="v1.37.2", kubelet_nodes=["gpu-0", "gpu-3"])
    for index, node in enumerate(state.kubelet_nodes):
        nl = kubelet_node.layout("abc123", tmp_path, node, index, {f"kubelet-{node}{s}": 1 for s in
                                                                   ("", "-healthz", "-stream")})
        assert state.kubelet_agent(node) == (str(nl.agent_socket), str(nl.agent_token))
    assert state.kubelet_agent("gpu-1") is None  # a kwok node has no agent
