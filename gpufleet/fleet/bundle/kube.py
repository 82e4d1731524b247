"""What a bundle holds for a Kubernetes node: the cluster's view of it, read through the API server
(any cluster: the Kubernetes sandbox's kwok nodes, or a real one), before remediation changes it.

- the Node (conditions such as node-problem-detector's GpuFleetProblem, taints, annotations,
  allocatable devices), as it was when the fault was detected;
- the events about the Node (NodeNotReady, the problem detector's events), newest last;
- every pod bound to the node, in every namespace (the training pods, the GPU Operator's driver and
  validator, the device plugin, DCGM's exporter): their phase, conditions, restarts, last states;
- the node's own inspect reading (its `inspect-<node>` ConfigMap, ADR 0074), what nvidia-smi, the
  kernel log and the fabric ports said the last time the node published;
- the node's series in Prometheus around the detection, when a Prometheus is given;
- the logs of every container on the node (the tail of each since the window's start, and of the
  previous instance of a container that restarted: the crash is in that one), read through the API
  server from the node's kubelet; a node with no kubelet endpoint (a kwok node) says so instead;
- with a node pod (`bundle.nodePod`, ADR 0085): what only the node itself holds (nvidia-bug-report,
  the kernel log, DCGM diagnostics, the daemons' journals), collected by a privileged pod on the node
  (gpufleet.fleet.bundle.nodepod) whose archive comes back through its log, kept whole as
  `node/bundle.tar.gz`. It takes a pod's start and the vendor's commands (a minute for
  nvidia-bug-report), so remediation's hook, which must not hold a quarantine, does not ask for it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.core.inspect_contract import INSPECT_NAMESPACE, configmap_name
from gpufleet.fleet.bundle.nodepod import decode
from gpufleet.fleet.bundle.runner import Collector, Read, ReadError
from gpufleet.fleet.bundle.sandbox import metrics_expr, metrics_read
from gpufleet.fleet.node_pod import START_MARGIN_S, NodePod, NodePodError, pod_name, run_on_node


def _json(doc: object) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()


def _api_read(api_client: Any, what: str, call: str, *args: Any, events: bool = False, **kwargs: Any) -> Read:
    """A read through the kubernetes client's CoreV1Api method `call`: the API server's JSON as it
    sent it (not the client's models, which drop what they do not know), pretty-printed; `events`:
    a list of Events, ordered oldest first."""
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        core = client.CoreV1Api(api_client)
        try:
            resp = getattr(core, call)(*args, _request_timeout=timeout, _preload_content=False, **kwargs)
            doc = json.loads(resp.data)
        except ApiException as e:
            raise ReadError(f"{what}: HTTP {e.status}: {e.reason}") from None
        except (HTTPError, OSError) as e:
            raise ReadError(f"{what}: {e}") from None
        except ValueError as e:
            raise ReadError(f"{what}: not JSON: {e}") from None
        if events and isinstance(doc, dict) and isinstance(doc.get("items"), list):
            doc["items"].sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return _json(doc), False
    return read


# Lines of each container's log kept (its tail): what leads up to a fault, not the job's whole run.
TAIL_LINES = 2000


@dataclass(frozen=True)
class LogTarget:
    namespace: str
    pod: str
    container: str
    previous: bool  # the instance before the last restart

    @property
    def header(self) -> str:
        return (f"==> {self.namespace}/{self.pod} container {self.container}"
                f"{' (previous instance)' if self.previous else ''} <==\n")


def no_kubelet_endpoint(node_doc: Mapping[str, Any]) -> str | None:
    """Why the API server cannot read container logs from this node, or None when it can (pure): a
    kubelet publishes the port it serves on in status.daemonEndpoints; kwok's nodes publish 0."""
    status = node_doc.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port") or 0
    if not port:
        return "the node publishes no kubelet endpoint (status.daemonEndpoints.kubeletEndpoint.Port is 0)"
    if not any(a.get("type") == "InternalIP" for a in status.get("addresses") or []):
        return "the node publishes no InternalIP address"
    return None


def log_targets(pods: Sequence[Mapping[str, Any]]) -> list[LogTarget]:
    """Every container of the pods that has run (pure): init containers, then the others, each once,
    and once more for its previous instance when it has restarted."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        for st in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            state = st.get("state") or {}
            if "waiting" in state and not st.get("restartCount"):
                continue  # never started: no log yet
            name = str(st["name"])
            if st.get("restartCount"):
                out.append(LogTarget(str(meta["namespace"]), str(meta["name"]), name, True))
            if "waiting" not in state:
                out.append(LogTarget(str(meta["namespace"]), str(meta["name"]), name, False))
    return out


def _pod_logs_read(api_client: Any, node: str, start: float, node_doc: Mapping[str, Any]) -> Read:
    """Each container's log tail on the node, one after another under headers, each its share of the
    byte cap; a log the kubelet would not give is a line saying why, not a failed collector."""
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        why = no_kubelet_endpoint(node_doc)
        if why is not None:
            return f"# no container logs from {node}: {why}\n".encode(), False
        end = time.monotonic() + timeout
        core = client.CoreV1Api(api_client)
        try:
            resp = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                    _request_timeout=timeout, _preload_content=False)
            targets = log_targets(json.loads(resp.data).get("items") or [])
        except ApiException as e:
            raise ReadError(f"pods on {node}: HTTP {e.status}: {e.reason}") from None
        except (HTTPError, OSError, ValueError) as e:
            raise ReadError(f"pods on {node}: {e}") from None
        share = max(cap // max(len(targets), 1) - 200, 1024)
        since = max(1, math.ceil(time.time() - start))
        parts, truncated = [], False
        for t in targets:
            left = end - time.monotonic()
            if left <= 0:
                parts.append(f"{t.header}(not read: the collector's {timeout:g} s ran out)\n".encode())
                truncated = True
                continue
            try:
                r = core.read_namespaced_pod_log(
                    t.pod, t.namespace, container=t.container, previous=t.previous, tail_lines=TAIL_LINES,
                    since_seconds=since, limit_bytes=share, _request_timeout=left, _preload_content=False)
                body = bytes(r.data)
            except ApiException as e:
                body = f"(not read: HTTP {e.status}: {e.reason})\n".encode()
            except (HTTPError, OSError) as e:
                body = f"(not read: {e})\n".encode()
            truncated = truncated or len(body) >= share
            parts.append(t.header.encode() + body + (b"" if body.endswith(b"\n") else b"\n"))
        data = b"".join(parts) or f"# no container has run on {node}\n".encode()
        return data[:cap], truncated or len(data) > cap
    return read


def _node_pod_read(api_client: Any, node: str, pod: NodePod, run_id: str) -> Read:
    """The node pod's archive (module docstring), whole: a cut archive is no archive, so one over the
    cap is an error, not a truncated member."""
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        try:
            run = run_on_node(api_client, pod, node, run_id, with_log=True)
        except NodePodError as e:
            raise ReadError(f"node pod: {e}") from None
        try:
            _, data = decode(run.log)
        except ValueError as e:
            raise ReadError(f"node pod ({run.detail}): {e}") from None
        if len(data) > cap:
            raise ReadError(f"node pod: its archive is {len(data)} bytes, over the collector's cap of {cap}")
        return data, False
    return read


def collectors(api_client: Any, node: str, start: float, end: float, prometheus_url: str | None = None,
               inspect_namespace: str = INSPECT_NAMESPACE, node_doc: Mapping[str, Any] | None = None,
               node_pod: NodePod | None = None, run_id: str = "") -> list[Collector]:
    """The node's collectors, most asked-for first (the total cap drops from the end)."""
    on_node = f"spec.nodeName={node}"
    about_node = f"involvedObject.kind=Node,involvedObject.name={node}"
    cm = configmap_name(node)
    out = [
        Collector("kube-node", "kube/node.json", ["GET", f"/api/v1/nodes/{node}"],
                  read=_api_read(api_client, f"node {node}", "read_node", node)),
        Collector("kube-node-events", "kube/node-events.json", ["GET", "/api/v1/events", about_node],
                  read=_api_read(api_client, f"node {node}'s events", "list_event_for_all_namespaces",
                                 events=True, field_selector=about_node)),
        Collector("kube-pods", "kube/pods.json", ["GET", "/api/v1/pods", on_node],
                  read=_api_read(api_client, f"pods on {node}", "list_pod_for_all_namespaces",
                                 field_selector=on_node)),
        Collector("inspect-reading", f"inspect/{cm}.json",
                  ["GET", f"/api/v1/namespaces/{inspect_namespace}/configmaps/{cm}"],
                  read=_api_read(api_client, f"ConfigMap {inspect_namespace}/{cm}",
                                 "read_namespaced_config_map", cm, inspect_namespace)),
    ]
    if node_doc is not None:
        out.append(Collector("kube-pod-logs", "kube/pod-logs.txt",
                             ["GET", "/api/v1/namespaces/<ns>/pods/<pod>/log", f"tailLines={TAIL_LINES}",
                              "for each container on the node"],
                             read=_pod_logs_read(api_client, node, start, node_doc)))
    if node_pod is not None:
        out.append(Collector("node-pod", "node/bundle.tar.gz",
                             ["pod", f"{node_pod.namespace}/{pod_name(node, run_id, node_pod.role)}",
                              *node_pod.command],
                             read=_node_pod_read(api_client, node, node_pod, run_id),
                             timeout_s=node_pod.deadline_s + START_MARGIN_S))
    if prometheus_url:
        what = ["GET", "/api/v1/query_range", metrics_expr(node), f"{start:.0f}", f"{end:.0f}"]
        out.append(Collector("metrics", "metrics/query_range.json", what,
                             read=metrics_read(prometheus_url, node, start, end, None)))
    return out
