"""What a node's `gpufleet inspect --here --publish` writes and `gpufleet inspect --kubernetes` reads
on a cluster, and where: shared by the inspect source (gpufleet.fleet.inspect.cluster), the Pulumi
program's per-node inspection (gpufleet.infra.fleet_inspect) and the Kubernetes sandbox, which are
sibling layers.

One ConfigMap per node in a namespace of its own: a node's writer (a ServiceAccount in
gpufleet-system, where its pods and their copy of the stack live) may create and update ConfigMaps
there and nowhere else, so a node can neither touch gpufleet's other objects (the stack copy, the
NCCL environment) nor patch Nodes (a cordon).
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


def configmap_name(node: str) -> str:
    """`inspect-<node>`; a node name too long for the prefix keeps its head and a hash of the whole."""
    name = NAME_PREFIX + node
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    return f"{name[:_NAME_MAX - 13].rstrip('.-')}-{digest}"


def node_label_value(node: str) -> str:
    """A label value holds 63 characters: a longer node name is named by its hash."""
    return node if len(node) <= 63 else hashlib.sha256(node.encode()).hexdigest()[:63]


def publisher_rules() -> list[dict[str, Any]]:
    """The writer's Role in INSPECT_NAMESPACE: `--publish` replaces its node's ConfigMap, creating it
    the first time; nothing else (RBAC cannot narrow `create` to a name, and the node's name is not
    known when the Role is written)."""
    return [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]}]
