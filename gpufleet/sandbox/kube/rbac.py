"""Namespaces, identities and permissions of the Kubernetes sandbox (pure manifests).

The chaos backend (gpufleet/chaos/backends/kubernetes.py) gets a ServiceAccount of its own,
`gpufleet-chaos` in the game-day namespace, allowed exactly the calls that backend makes and
nothing else (a unit test reads the backend's calls and holds these rules to them, both ways):

| backend call                             | permission                                 | scope              |
|------------------------------------------|--------------------------------------------|--------------------|
| list_node, read_node                     | nodes: list, get                           | cluster            |
| patch_node (cordon, taints, resume)      | nodes: patch                               | cluster            |
| patch_node_status (a simulated node's    | nodes/status: patch                        | cluster            |
|   node-health condition)                 |                                            |                    |
| create_namespaced_pod_eviction           | pods/eviction: create (honours PDBs)       | cluster (any job)  |
| create_namespaced_pod, delete_…_pod      | pods: create, delete (fault, undo pods)    | game-day ns only   |
| create/read/patch_namespaced_config_map  | configmaps: create; get, patch of the      | game-day ns only   |
|   (the fault ledger, kube_ledger)        |   ledger's name only                       |                    |
| read/patch_namespaced_lease (a simulated | leases: get, patch                         | kube-node-lease ns |
|   node's crash and return)               |                                            |                    |
| list_namespaced_pod, read_namespaced_job | pods: list; jobs: get (the training Job)   | training ns only   |

Not granted, because the backend does not do it: watching anything, reading pods outside the
training namespace, creating or deleting Leases, reading PodDisruptionBudgets (the API server
enforces them on eviction), and secrets of any kind.

The platform's remediation stand-in (gpufleet/sandbox/kube/remediation.py) runs as
`gpufleet-remediation` in REMEDIATION_NAMESPACE: nodes get/list/watch/patch (quarantine, release),
pods list (what is on a node) and pods/eviction create (drain), cluster-wide; no secrets, no node
status, no deletes.

kwok acts for the nodes' kubelets as user `gpufleet:kwok` (a client certificate, pki.py) with the
permissions kwok's own manifests give its controller, less its optional CRDs: node and pod status,
pod deletion, node Leases, events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.core.inspect_contract import (
    INSPECT_NAMESPACE,
    PUBLISHER_NAMESPACE,
    PUBLISHER_SERVICE_ACCOUNT,
    own_node_policy,
    publisher_rules,
)
from gpufleet.core.kube_client import SYSTEM_NAMESPACE
from gpufleet.core.ledger_location import LEDGER_CONFIGMAP
from gpufleet.sandbox.kube.pki import KUBELET_CLIENT_USER, KWOK_USER

CHAOS_SERVICE_ACCOUNT = "gpufleet-chaos"
NODE_LEASE_NAMESPACE = "kube-node-lease"
REMEDIATION_NAMESPACE = SYSTEM_NAMESPACE
REMEDIATION_SERVICE_ACCOUNT = "gpufleet-remediation"
REMEDIATION_ROLE = "gpufleet-remediation"
# Who collects a node's diagnostic bundle before remediation quarantines it (fleet.bundle.kube):
# read-only, the reads that collection makes and nothing else.
BUNDLE_SERVICE_ACCOUNT = "gpufleet-bundle"
CHAOS_ROLE = "gpufleet-chaos"  # the ClusterRole and, in the game-day namespace, the Role
KWOK_ROLE = "gpufleet-kwok"
MANAGED = {"app.kubernetes.io/managed-by": "gpufleet-sandbox"}
# Pod Security admission level (pod-security.kubernetes.io/enforce, Kubernetes docs "Pod Security
# Admission"): the game-day namespace runs the chaos backend's privileged fault pods.
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PRIVILEGED_REASON = (
    "fault pods of the chaos backend are privileged: hostPID, /dev/kmsg, host network for link faults"
)

Rule = dict[str, list[str]]


def chaos_cluster_rules() -> list[Rule]:
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]


def ledger_rules() -> list[Rule]:
    """The fault ledger's ConfigMap (chaos.backends.kube_ledger): created on the first fault, then
    read and patched by that name only (RBAC cannot narrow `create` to a name)."""
    return [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [LEDGER_CONFIGMAP],
         "verbs": ["get", "patch"]},
    ]


def chaos_namespace_rules() -> list[Rule]:
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}, *ledger_rules()]


def chaos_lease_rules() -> list[Rule]:
    """In kube-node-lease: a simulated node's crash takes its Lease over, the rollback releases it."""
    return [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "patch"]}]


def chaos_training_rules() -> list[Rule]:
    """In the training namespace: the training Job's pods and parallelism (the workload)."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
    ]


def remediation_rules() -> list[Rule]:
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]


def bundle_rules() -> list[Rule]:
    """The node, its events, the pods on it and their logs: cluster-wide reads (fleet.bundle.kube)."""
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]


def bundle_inspect_rules() -> list[Rule]:
    """The node's inspect reading, in the inspect namespace only."""
    return [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]


def kwok_rules() -> list[Rule]:
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["patch", "update"]},
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "patch", "update", "delete"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "get", "list", "watch", "patch", "update"],
        },
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    ]


def namespace(name: str, privileged: bool) -> dict[str, Any]:
    labels = dict(MANAGED)
    annotations = {}
    if privileged:
        labels[PSA_ENFORCE] = "privileged"
        annotations["gpufleet.io/privileged-because"] = PRIVILEGED_REASON
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def role_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def kwok_objects() -> list[dict[str, Any]]:
    """kwok's ClusterRole, bound to its certificate's user."""
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": KWOK_ROLE, "labels": MANAGED}
    return [
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": meta, "rules": kwok_rules()},
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": role_ref("ClusterRole", KWOK_ROLE),
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KWOK_USER}],
        },
    ]


def kubelet_api_objects() -> list[dict[str, Any]]:
    """The API server's kubelet client bound to the bootstrap ClusterRole `system:kubelet-api-admin`
    (every kubelet API: logs, exec, stats), which the kubelets' webhook authorization asks about."""
    return [{
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpufleet:kubelet-api-admin", "labels": MANAGED},
        "roleRef": role_ref("ClusterRole", "system:kubelet-api-admin"),
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT_USER}],
    }]


def _role_and_binding(
    name: str, namespace: str, rules: list[Rule], subject: dict[str, str]
) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": name, "namespace": namespace, "labels": MANAGED}
    return [
        {"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta, "roleRef": role_ref("Role", name),
         "subjects": [subject]},
    ]


def _cluster_role_and_binding(name: str, rules: list[Rule], subject: dict[str, str]) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": name, "labels": MANAGED}
    return [
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": meta, "rules": rules},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": role_ref("ClusterRole", name), "subjects": [subject]},
    ]


def _service_account(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace, "labels": MANAGED},
        "automountServiceAccountToken": False,
    }


def chaos_objects(fault_namespace: str, training_namespace: str) -> list[dict[str, Any]]:
    """The chaos backend's ServiceAccount (no token Secret: tokens come from TokenRequest), its
    ClusterRole and binding, and its Roles in the fault namespace, kube-node-lease and the training
    namespace; the namespace comes first."""
    subject = {"kind": "ServiceAccount", "name": CHAOS_SERVICE_ACCOUNT, "namespace": fault_namespace}
    return [
        namespace(fault_namespace, privileged=True),
        _service_account(CHAOS_SERVICE_ACCOUNT, fault_namespace),
        *_cluster_role_and_binding(CHAOS_ROLE, chaos_cluster_rules(), subject),
        *_role_and_binding(CHAOS_ROLE, fault_namespace, chaos_namespace_rules(), subject),
        *_role_and_binding(CHAOS_ROLE, NODE_LEASE_NAMESPACE, chaos_lease_rules(), subject),
        *_role_and_binding(CHAOS_ROLE, training_namespace, chaos_training_rules(), subject),
    ]


def inspect_objects() -> list[dict[str, Any]]:
    """Where the nodes' inspect results live (core.inspect_contract), their writer's ServiceAccount
    and Role there, and the admission policy that holds each node's writer to its own ConfigMap, as
    the Pulumi program declares them (infra.fleet_inspect)."""
    subject = {"kind": "ServiceAccount", "name": PUBLISHER_SERVICE_ACCOUNT, "namespace": PUBLISHER_NAMESPACE}
    return [
        namespace(PUBLISHER_NAMESPACE, privileged=False),
        namespace(INSPECT_NAMESPACE, privileged=False),
        _service_account(PUBLISHER_SERVICE_ACCOUNT, PUBLISHER_NAMESPACE),
        *_role_and_binding(PUBLISHER_SERVICE_ACCOUNT, INSPECT_NAMESPACE, publisher_rules(), subject),
        *own_node_policy(),
    ]


def remediation_objects() -> list[dict[str, Any]]:
    """The remediation stand-in's namespace, ServiceAccount and ClusterRole (and binding)."""
    subject = {
        "kind": "ServiceAccount", "name": REMEDIATION_SERVICE_ACCOUNT, "namespace": REMEDIATION_NAMESPACE
    }
    return [
        namespace(REMEDIATION_NAMESPACE, privileged=False),
        _service_account(REMEDIATION_SERVICE_ACCOUNT, REMEDIATION_NAMESPACE),
        *_cluster_role_and_binding(REMEDIATION_ROLE, remediation_rules(), subject),
    ]


def bundle_objects() -> list[dict[str, Any]]:
    """The bundle collector's ServiceAccount, its ClusterRole and its Role in the inspect namespace."""
    subject = {"kind": "ServiceAccount", "name": BUNDLE_SERVICE_ACCOUNT, "namespace": REMEDIATION_NAMESPACE}
    return [
        _service_account(BUNDLE_SERVICE_ACCOUNT, REMEDIATION_NAMESPACE),
        *_cluster_role_and_binding(BUNDLE_SERVICE_ACCOUNT, bundle_rules(), subject),
        *_role_and_binding(BUNDLE_SERVICE_ACCOUNT, INSPECT_NAMESPACE, bundle_inspect_rules(), subject),
    ]


def cluster_role(docs: Iterable[Any]) -> dict[str, Any]:
    """The one ClusterRole of a controller-gen rbac/role.yaml (an operator's generated role)."""
    roles = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ClusterRole"]
    if len(roles) != 1:
        raise ValueError(f"expected one ClusterRole in a generated role.yaml, found {len(roles)}")
    return roles[0]
