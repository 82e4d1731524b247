"""The inspect source of a Kubernetes cluster: every node inspects itself, one sweep reads them all
(docs/fleet-inspect.md, "On Kubernetes").

A node's own `gpufleet inspect --here --publish` (the Pulumi program's DaemonSet runs it,
gpufleet.infra.fleet_inspect) writes its observation, the NodeObservation every check takes, to a
ConfigMap `inspect-<node>` in its own namespace, labelled with the node's name
(gpufleet.core.inspect_contract). `gpufleet inspect --kubernetes` lists the
nodes, the ConfigMaps and the GPU pods, and judges every node of the stack's pools with the same
checks, history and lemon rules as the other backends:
- pool, SKU and expected GPU count come from the stack through the node's pool label, not from what
  the node said of itself; the scheduler's view (drained, down, idle, allocated, mixed) from the Node
  (cordon, Ready) and the GPU requests of its pods;
- a node that published nothing, published something unreadable or for another node, or last
  published more than `max_age_s` ago is UNKNOWN with the reason: old readings are not judged as
  today's;
- the jobs that excluded a node since its previous sweep come from the pods' required node
  affinity (gpufleet.fleet.inspect.exclusions.pod_exclusions), as Slurm's come from ExcNodeList.

A ConfigMap per node rather than a Node annotation: a node's writer needs only ConfigMaps in one
namespace (not patch on Nodes, which is a cordon), and each write wakes no Node watcher.

`publish_body`, `published_observation` and `observations_from_cluster` are pure; `publish` and
`read_cluster` are the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpufleet.config import AcceleratorModel
from gpufleet.config.placement import POOL_LABEL
from gpufleet.core.inspect_contract import (
    DATA_KEY,
    DEFAULT_MAX_AGE_S,
    NODE_LABEL,
    PUBLISHED_BY_ANNOTATION,
    configmap_name,
    node_label_value,
)
from gpufleet.fleet.inspect.exclusions import pod_exclusions
from gpufleet.fleet.inspect.observation import NodeObservation, SchedState

# The device plugins' extended resources: NVIDIA's, AMD's, Huawei's (their device plugin docs).
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend")


@dataclass(frozen=True)
class PoolShape:
    """What the stack says of a pool's nodes."""

    sku: AcceleratorModel
    expected_gpus: int


def publish_body(obs: NodeObservation, namespace: str, pod: str | None = None) -> dict[str, Any]:
    """The node's ConfigMap; `pod`: the publisher pod writing it, when it runs in one."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": configmap_name(obs.node), "namespace": namespace,
                     "labels": {NODE_LABEL: node_label_value(obs.node),
                                "app.kubernetes.io/managed-by": "gpufleet"},
                     "annotations": {PUBLISHED_BY_ANNOTATION: pod} if pod else {}},
        "data": {DATA_KEY: obs.model_dump_json()},
    }


def _gpu_requests(pod: Mapping[str, Any]) -> int:
    """GPUs a pod's containers ask for (an extended resource's request equals its limit)."""
    n = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for k, v in asked.items():
            if k.startswith(GPU_RESOURCE_PREFIXES):
                try:
                    n += int(v)
                except (TypeError, ValueError):
                    continue
    return n


def gpus_in_use(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs requested by the running or pending pods on each node."""
    out: dict[str, int] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        phase = (p.get("status") or {}).get("phase")
        gone = (p.get("metadata") or {}).get("deletionTimestamp")
        if not node or phase not in ("Pending", "Running") or gone:
            continue
        out[node] = out.get(node, 0) + _gpu_requests(p)
    return out


def sched_state(node: Mapping[str, Any], in_use: int, expected_gpus: int) -> SchedState:
    """The scheduler's view of a node, in the Slurm words inspect's plan reads."""
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}
    if conds.get("Ready") != "True":
        return "down"
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    if in_use == 0:
        return "drained" if cordoned else "idle"
    if cordoned:
        return "draining"
    return "allocated" if in_use >= expected_gpus else "mixed"


def published_observation(cm: Mapping[str, Any] | None, node: str, now: float, max_age_s: float
                          ) -> tuple[NodeObservation | None, str | None]:
    """The node's observation in its ConfigMap, or None and why it cannot be judged."""
    if cm is None:
        return None, "no inspect result published by the node (`gpufleet inspect --here --publish`)"
    text = (cm.get("data") or {}).get(DATA_KEY)
    if not text:
        return None, f"ConfigMap {cm['metadata']['name']} has no {DATA_KEY}"
    return judge_published(text, f"ConfigMap {cm['metadata']['name']}", node, now, max_age_s)


def judge_published(text: str, where: str, node: str, now: float, max_age_s: float
                    ) -> tuple[NodeObservation | None, str | None]:
    """What a node published (`where`: the ConfigMap or file it came from), or None and why it
    cannot be judged: unreadable, about another node, or older than `max_age_s`."""
    try:
        obs = NodeObservation.model_validate_json(text)
    except ValidationError as e:
        return None, f"{where}: unreadable observation: {e.errors()[0]['msg']}"
    if obs.node != node:
        return None, f"{where} describes node {obs.node}, not {node}"
    age = now - obs.at
    if age > max_age_s:
        return None, f"last published {age:.0f} s ago (older than {max_age_s:g} s)"
    return obs, None


def observations_from_cluster(
    nodes: Sequence[Mapping[str, Any]], configmaps: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]], pools: Mapping[str, PoolShape], *, now: float,
    max_age_s: float = DEFAULT_MAX_AGE_S, since: Mapping[str, float] | None = None,
) -> list[NodeObservation]:
    """One observation per node of the stack's `pools` (by the node's pool label), sorted by name.
    `since`: each node's previous sweep (job exclusions are counted after it)."""
    by_name = {str(cm["metadata"]["name"]): cm for cm in configmaps}
    in_use = gpus_in_use(pods)
    excluded = pod_exclusions(pods, nodes, since or {})
    out = []
    for n in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(n["metadata"]["name"])
        pool = ((n["metadata"].get("labels") or {}).get(POOL_LABEL))
        shape = pools.get(pool or "")
        if pool is None or shape is None:
            continue
        state = sched_state(n, in_use.get(name, 0), shape.expected_gpus)
        mine = {"pool": pool, "sku": shape.sku, "expected_gpus": shape.expected_gpus, "sched_state": state,
                "job_exclusions": excluded.get(name, 0)}
        obs, why = published_observation(by_name.get(configmap_name(name)), name, now, max_age_s)
        if obs is None:
            out.append(NodeObservation(node=name, at=now, unknown=(why or "",), **mine))
        else:
            out.append(obs.model_copy(update=mine))
    return out


# ----------------------------------------------------------------------------- I/O


def publish(api_client: Any, obs: NodeObservation, namespace: str, pod: str | None = None) -> str:
    """Create or replace the node's ConfigMap; returns its name."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    body = publish_body(obs, namespace, pod)
    name = body["metadata"]["name"]
    try:
        core.replace_namespaced_config_map(name, namespace, body)
    except ApiException as e:
        if e.status != 404:
            raise
        core.create_namespaced_config_map(namespace, body)
    return str(name)


def read_cluster(api_client: Any, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                            list[dict[str, Any]]]:
    """(nodes, inspect ConfigMaps, pods) as the API server's JSON. Finished pods too: a job that
    excluded a node counts after it ended (gpus_in_use skips them)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def plain(items: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = api_client.sanitize_for_serialization(items)
        return out

    nodes = plain(core.list_node().items)
    cms = plain(core.list_namespaced_config_map(namespace, label_selector=NODE_LABEL).items)
    pods = plain(core.list_pod_for_all_namespaces().items)
    return nodes, cms, pods
