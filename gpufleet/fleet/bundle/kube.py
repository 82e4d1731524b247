"""What a bundle holds for a Kubernetes node: the cluster's view of it, read through the API server
(any cluster: the Kubernetes sandbox's kwok nodes, or a real one), before remediation changes it.

- the Node (conditions such as node-problem-detector's GpuFleetProblem, taints, annotations,
  allocatable devices), as it was when the fault was detected;
- the events about the Node (NodeNotReady, the problem detector's events), newest last;
- every pod bound to the node, in every namespace (the training pods, the GPU Operator's driver and
  validator, the device plugin, DCGM's exporter): their phase, conditions, restarts, last states;
- the node's own inspect reading (its `inspect-<node>` ConfigMap, ADR 0074), what nvidia-smi, the
  kernel log and the fabric ports said the last time the node published;
- the node's series in Prometheus around the detection, when a Prometheus is given.

What only the node itself holds (nvidia-bug-report, dmesg, DCGM diagnostics) needs a privileged pod
on the node, which this collection does not start (docs/diagnostic-bundles.md, "Left out").
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.core.inspect_contract import INSPECT_NAMESPACE, configmap_name
from gpufleet.fleet.bundle.runner import Collector, Read, ReadError
from gpufleet.fleet.bundle.sandbox import metrics_expr, metrics_read


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


def collectors(api_client: Any, node: str, start: float, end: float, prometheus_url: str | None = None,
               inspect_namespace: str = INSPECT_NAMESPACE) -> list[Collector]:
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
    if prometheus_url:
        what = ["GET", "/api/v1/query_range", metrics_expr(node), f"{start:.0f}", f"{end:.0f}"]
        out.append(Collector("metrics", "metrics/query_range.json", what,
                             read=metrics_read(prometheus_url, node, start, end, None)))
    return out
