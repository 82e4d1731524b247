"""Namespaces, identities and permissions of the Kubernetes sandbox (pure manifests).

The chaos backend (gpufleet/chaos/backends/kubernetes.py) gets a ServiceAccount of its own,
`gpufleet-chaos` in the game-day namespace, allowed exactly the calls that backend makes and
nothing else (a unit test reads the backend's calls and holds these rules to them, both ways):

| backend call                         | permission                                  | scope             |
|--------------------------------------|---------------------------------------------|-------------------|
| list_node, read_node                 | nodes: list, get                            | cluster           |
| patch_node (cordon, taints)          | nodes: patch                                | cluster           |
| create_namespaced_pod_eviction       | pods/eviction: create (honours PDBs)        | cluster (any job) |
| create_namespaced_pod, delete_…_pod  | pods: create, delete (fault and undo pods)  | game-day ns only  |

Not granted, because the backend does not do it: watching nodes, node status (it sets no
condition), reading or listing pods, reading PodDisruptionBudgets (the API server enforces them on
eviction), and secrets of any kind.

kwok acts for the nodes' kubelets as user `gpufleet:kwok` (a client certificate, pki.py) with the
permissions kwok's own manifests give its controller, less its optional CRDs: node and pod status,
pod deletion, node Leases, events.
"""

from __future__ import annotations

from typing import Any

from gpufleet.sandbox.kube.pki import KWOK_USER

CHAOS_SERVICE_ACCOUNT = "gpufleet-chaos"
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
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]


def chaos_namespace_rules() -> list[Rule]:
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}]


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


def _role_ref(kind: str, name: str) -> dict[str, str]:
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
            "roleRef": _role_ref("ClusterRole", KWOK_ROLE),
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KWOK_USER}],
        },
    ]


def chaos_objects(fault_namespace: str) -> list[dict[str, Any]]:
    """The chaos backend's ServiceAccount (no token Secret: tokens come from TokenRequest), its
    ClusterRole and binding, and its Role in the fault namespace; the namespace comes first."""
    rbac = "rbac.authorization.k8s.io/v1"
    subject = {"kind": "ServiceAccount", "name": CHAOS_SERVICE_ACCOUNT, "namespace": fault_namespace}
    return [
        namespace(fault_namespace, privileged=True),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": CHAOS_SERVICE_ACCOUNT, "namespace": fault_namespace, "labels": MANAGED},
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": CHAOS_ROLE, "labels": MANAGED},
            "rules": chaos_cluster_rules(),
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CHAOS_ROLE, "labels": MANAGED},
            "roleRef": _role_ref("ClusterRole", CHAOS_ROLE),
            "subjects": [subject],
        },
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": CHAOS_ROLE, "namespace": fault_namespace, "labels": MANAGED},
            "rules": chaos_namespace_rules(),
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": CHAOS_ROLE, "namespace": fault_namespace, "labels": MANAGED},
            "roleRef": _role_ref("Role", CHAOS_ROLE),
            "subjects": [subject],
        },
    ]
