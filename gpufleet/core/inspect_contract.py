"""What a node's `gpufleet inspect --here --publish` writes and `gpufleet inspect --kubernetes` reads
on a cluster (on a Slurm cluster: `--publish-dir` and `--slurm`, a file per node), and where: shared
by the inspect sources (gpufleet.fleet.inspect.cluster, .slurm_cluster), the Pulumi program's
per-node inspection (gpufleet.infra.fleet_inspect) and the Kubernetes sandbox, which are sibling
layers.

One ConfigMap per node in a namespace of its own: a node's writer (a ServiceAccount in
gpufleet-system, where its pods and their copy of the stack live) may create and update ConfigMaps
there and nowhere else, so a node can neither touch gpufleet's other objects (the stack copy, the
NCCL environment) nor patch Nodes (a cordon).

RBAC cannot narrow that to the writer's own node's ConfigMap: one ServiceAccount serves every node.
The API server can (ADR 0077): a token bound to a Pod or a Node carries the node's name, and the
pod's, in the requester's extra fields, and a ValidatingAdmissionPolicy (own_node_policy) lets the
writer create or update only `inspect-<its node>`, labelled with its node, and name as writer only
the pod its token is bound to.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gpufleet.core.kube_client import SYSTEM_NAMESPACE

INSPECT_NAMESPACE = "gpufleet-inspect"
PUBLISHER_SERVICE_ACCOUNT = "gpufleet-inspect"  # the nodes' writer (the DaemonSet's pods), in:
PUBLISHER_NAMESPACE = SYSTEM_NAMESPACE
# On the publisher's pods (the Pulumi program's DaemonSets): the upgrade gate restarts the one on a
# node it gates, so that a reading is taken through the node's new driver.
PUBLISHER_APP_LABEL = ("app.kubernetes.io/name", "gpufleet-inspect")
NODE_LABEL = "gpufleet.io/inspect-node"  # on each ConfigMap: the node it describes
# On each ConfigMap: the pod that wrote it (POD_NAME_ENV, from the downward API), so the upgrade
# gate tells a new publisher's reading from one its deleted predecessor wrote while terminating.
PUBLISHED_BY_ANNOTATION = "gpufleet.io/published-by"
POD_NAME_ENV = "POD_NAME"
DATA_KEY = "observation.json"
NAME_PREFIX = "inspect-"
PUBLISH_INTERVAL_S = 300  # how often the Pulumi program's DaemonSet publishes
DEFAULT_MAX_AGE_S = 3.0 * PUBLISH_INTERVAL_S  # older is UNKNOWN: three missed runs
_NAME_MAX = 253  # a ConfigMap name is a DNS subdomain
# The most a published reading may hold: a ConfigMap's data cannot exceed 1 MiB (Kubernetes docs,
# "ConfigMaps"), and a Slurm node's file is held to the same. A node's observation is about 2 KB.
PUBLISHED_MAX_BYTES = 1 << 20


def configmap_name(node: str) -> str:
    """`inspect-<node>`; a node name too long for the prefix keeps its head and a hash of the whole."""
    return _capped(NAME_PREFIX + node, node, _NAME_MAX)


def _capped(name: str, node: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    return f"{name[:limit - 13].rstrip('.-')}-{digest}"


# On a Slurm cluster (ADR 0088) a node writes the same observation to a file `inspect-<node>.json` in
# a folder every node and the sweeping host mount (the cluster's shared file system), written whole
# (a temporary file renamed over the old one), so the sweep never reads half of one.
PUBLISHED_FILE_SUFFIX = ".json"
_FILE_NAME_MAX = 255  # NAME_MAX of Linux file systems, in bytes


def published_file_name(node: str) -> str:
    """`inspect-<node>.json`; a node name too long keeps its head and a hash of the whole."""
    if not node or "/" in node or node in (".", ".."):
        raise ValueError(f"node name {node!r} cannot name a file")
    stem = _capped(NAME_PREFIX + node, node, _FILE_NAME_MAX - len(PUBLISHED_FILE_SUFFIX))
    return stem + PUBLISHED_FILE_SUFFIX


def node_label_value(node: str) -> str:
    """A label value holds 63 characters: a longer node name is named by its hash."""
    return node if len(node) <= 63 else hashlib.sha256(node.encode()).hexdigest()[:63]


def publisher_rules() -> list[dict[str, Any]]:
    """The writer's Role in INSPECT_NAMESPACE: `--publish` replaces its node's ConfigMap, creating it
    the first time; nothing else (RBAC cannot narrow `create` to a name, and the node's name is not
    known when the Role is written: own_node_policy narrows it)."""
    return [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]}]


# The requester's extra fields a bound ServiceAccount token carries: the node of the Pod (or the
# Node) it is bound to, and the Pod's name (k8s.io/apiserver authentication/serviceaccount,
# NodeNameKey and PodNameKey).
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
OWN_NODE_POLICY = "gpufleet-inspect-own-node"
# A node whose `inspect-<node>` would be longer than a ConfigMap name is refused by the policy: CEL
# cannot compute configmap_name's hash. Real node names are DNS labels or short FQDNs.
OWN_NODE_NAME_MAX = _NAME_MAX - len(NAME_PREFIX)


def own_node_policy() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy that holds the nodes' writer to its own node's ConfigMap, and
    its binding (admissionregistration.k8s.io/v1; Kubernetes docs, "Validating Admission Policy")."""
    writer = f"system:serviceaccount:{PUBLISHER_NAMESPACE}:{PUBLISHER_SERVICE_ACCOUNT}"

    def extra(key: str) -> str:
        return (f"has(request.userInfo.extra) && '{key}' in request.userInfo.extra ? "
                f"request.userInfo.extra['{key}'][0] : ''")

    labelled = (f"has(object.metadata.labels) && '{NODE_LABEL}' in object.metadata.labels && "
                f"object.metadata.labels['{NODE_LABEL}'] == variables.node")
    unannotated = (f"!has(object.metadata.annotations) || "
                   f"!('{PUBLISHED_BY_ANNOTATION}' in object.metadata.annotations)")
    validations = [
        {"expression": "variables.node != ''", "reason": "Forbidden",
         "message": f"the inspect writer's token is bound to no node: the API server adds {NODE_NAME_EXTRA} "
                    "only to a token bound to a Pod or a Node"},
        {"expression": f"size(variables.node) <= {OWN_NODE_NAME_MAX} && "
                       f"object.metadata.name == '{NAME_PREFIX}' + variables.node", "reason": "Forbidden",
         "messageExpression": f"'node ' + variables.node + ' may write only ConfigMap {NAME_PREFIX}' + "
                              "variables.node"},
        {"expression": f"size(variables.node) > 63 || ({labelled})", "reason": "Forbidden",
         "messageExpression": f"'node ' + variables.node + ' must label its ConfigMap {NODE_LABEL}=' + "
                              "variables.node"},
        {"expression": f"{unannotated} || (variables.pod != '' && "
                       f"object.metadata.annotations['{PUBLISHED_BY_ANNOTATION}'] == variables.pod)",
         "reason": "Forbidden",
         "messageExpression": f"'{PUBLISHED_BY_ANNOTATION} must name the pod the token is bound to (' + "
                              "(variables.pod == '' ? 'none' : variables.pod) + ')'"},
    ]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": OWN_NODE_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": INSPECT_NAMESPACE}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                   "operations": ["CREATE", "UPDATE"]}],
            },
            "matchConditions": [{"name": "the-nodes-writer",
                                 "expression": f"request.userInfo.username == '{writer}'"}],
            "variables": [{"name": "node", "expression": extra(NODE_NAME_EXTRA)},
                          {"name": "pod", "expression": extra(POD_NAME_EXTRA)}],
            "validations": validations,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": OWN_NODE_POLICY},
        "spec": {"policyName": OWN_NODE_POLICY, "validationActions": ["Deny"]},
    }
    return [policy, binding]
