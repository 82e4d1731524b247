"""A Kubernetes node's bundle (fleet.bundle.kube) through the real kubernetes client against a
loopback stand-in of the API server's read endpoints: the members, their order, a failed read kept
as failed, the containers' logs (the previous instance of one that restarted), a node without a
kubelet endpoint saying so, and the collector's identity holding exactly the reads it makes (sandbox
rbac)."""

from __future__ import annotations

import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from gpufleet.fleet.bundle.caps import SANDBOX_CAPS
from gpufleet.fleet.bundle.kube import no_kubelet_endpoint
from gpufleet.fleet.bundle.service import BundleInputError, collect_kubernetes
from gpufleet.sandbox.kube import rbac

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-3"},
        "status": {"conditions": [{"type": "GpuFleetProblem", "status": "True", "message": "XID 79"}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.3.3"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}
KWOK_NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-5"},
             "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}}}
EVENTS = {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": [
    {"metadata": {"name": "b", "namespace": "default"}, "involvedObject": {"kind": "Node", "name": "gpu-3"},
     "reason": "NodeNotReady", "lastTimestamp": "2026-12-06T06:00:09Z"},
    {"metadata": {"name": "a", "namespace": "default"}, "involvedObject": {"kind": "Node", "name": "gpu-3"},
     "reason": "GpuFleetProblem", "lastTimestamp": "2026-12-06T06:00:01Z"},
]}
PODS = {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
    {"metadata": {"name": "train-1", "namespace": "default"}, "spec": {"nodeName": "gpu-3"},
     "status": {"phase": "Running",
                "initContainerStatuses": [{"name": "wait-driver", "restartCount": 0,
                                           "state": {"terminated": {"exitCode": 0}}}],
                "containerStatuses": [{"name": "trainer", "restartCount": 1, "state": {"running": {}}},
                                      {"name": "sidecar", "restartCount": 0,
                                       "state": {"waiting": {"reason": "ContainerCreating"}}}]}}]}
# (container, previous) -> its log, as the kubelet would give it through the API server
LOGS = {("wait-driver", "false"): "driver ready\n", ("trainer", "false"): "step 1\n",
        ("trainer", "true"): "step 7\nNCCL error: unhandled system error\n"}
# (method, path) -> what the collector's identity needs for it: (resource, verb, scope)
ROUTES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("GET", "/api/v1/nodes/gpu-3"): ("nodes", "get", "cluster"),
    ("GET", "/api/v1/events"): ("events", "list", "cluster"),
    ("GET", "/api/v1/pods"): ("pods", "list", "cluster"),
    ("GET", "/api/v1/namespaces/gpufleet-inspect/configmaps/inspect-gpu-3"): ("configmaps", "get", "inspect"),
    ("GET", "/api/v1/namespaces/default/pods/train-1/log"): ("pods/log", "get", "cluster"),
}


class Api(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        Api.seen.append(("GET", url.path, query))
        if url.path == "/api/v1/namespaces/default/pods/train-1/log":
            text = LOGS[(query["container"][0], query["previous"][0])].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        body: dict[str, Any] | None = {
            "/api/v1/nodes/gpu-3": NODE, "/api/v1/nodes/gpu-5": KWOK_NODE, "/api/v1/events": EVENTS,
            "/api/v1/pods": PODS,
        }.get(url.path)
        if body is None:  # gpu-3 never published an inspect reading; any other node is unknown
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                    "code": 404}
        data = json.dumps(body).encode()
        self.send_response(int(body.get("code", 200)))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api_client() -> Iterator[Any]:
    Api.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = client.ApiClient(cfg)
    try:
        yield api
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def test_the_bundle_holds_the_clusters_view_of_the_node(api_client: Any, tmp_path: Path) -> None:
    path, manifest = collect_kubernetes(api_client, "gpu-3", tmp_path, SANDBOX_CAPS, stack="sandbox",
                                        trigger="remediation", reason="gpu-xid-79",
                                        detected_at=1_796_536_800.0)
    assert (manifest.source, manifest.trigger, manifest.reason) == ("kubernetes", "remediation", "gpu-xid-79")
    status = {m.collector: m.status for m in manifest.members}
    assert status == {"kube-node": "ok", "kube-node-events": "ok", "kube-pods": "ok",
                      "inspect-reading": "failed",  # no published reading: said, not hidden
                      "kube-pod-logs": "ok"}
    assert "HTTP 404" in (manifest.member("inspect-reading").error or "")
    with tarfile.open(path) as tar:
        def member(name: str) -> Any:
            f = tar.extractfile(name)
            assert f is not None
            return json.loads(f.read())
        assert member("kube/node.json")["status"]["conditions"][0]["message"] == "XID 79"
        assert [e["reason"] for e in member("kube/node-events.json")["items"]] == ["GpuFleetProblem",
                                                                                   "NodeNotReady"]
        assert member("kube/pods.json")["items"][0]["metadata"]["name"] == "train-1"
        logs = tar.extractfile("kube/pod-logs.txt")
        assert logs is not None
        # The init container, the trainer's crashed instance and its running one; the sidecar that
        # never started has no log to ask for.
        assert logs.read().decode() == (
            "==> default/train-1 container wait-driver <==\ndriver ready\n"
            "==> default/train-1 container trainer (previous instance) <==\n"
            "step 7\nNCCL error: unhandled system error\n"
            "==> default/train-1 container trainer <==\nstep 1\n")
    log_queries = [q for _, p, q in Api.seen if p.endswith("/log")]
    assert {q["tailLines"][0] for q in log_queries} == {"2000"}
    # From the window's start: the detection (1_796_536_800) minus the 5 minutes before it, and later.
    assert all(int(q["sinceSeconds"][0]) >= 300 for q in log_queries)
    queries = {p: q for _, p, q in Api.seen}
    assert queries["/api/v1/events"]["fieldSelector"] == [
        "involvedObject.kind=Node,involvedObject.name=gpu-3"]
    assert queries["/api/v1/pods"]["fieldSelector"] == ["spec.nodeName=gpu-3"]


def test_the_collectors_identity_holds_exactly_its_reads(api_client: Any, tmp_path: Path) -> None:
    collect_kubernetes(api_client, "gpu-3", tmp_path, SANDBOX_CAPS)
    made = {ROUTES[(m, p)] for m, p, _ in Api.seen}  # a KeyError is a read this test does not know
    granted = {(r, v, "cluster") for rule in rbac.bundle_rules() for r in rule["resources"]
               for v in rule["verbs"]}
    granted |= {(r, v, "inspect") for rule in rbac.bundle_inspect_rules() for r in rule["resources"]
                for v in rule["verbs"]}
    assert made == granted


def test_a_node_without_a_kubelet_endpoint_says_why_it_has_no_logs(api_client: Any, tmp_path: Path) -> None:
    path, manifest = collect_kubernetes(api_client, "gpu-5", tmp_path, SANDBOX_CAPS)
    assert manifest.member("kube-pod-logs").status == "ok"
    with tarfile.open(path) as tar:
        f = tar.extractfile("kube/pod-logs.txt")
        assert f is not None
        assert f.read().decode() == ("# no container logs from gpu-5: the node publishes no kubelet endpoint "
                                     "(status.daemonEndpoints.kubeletEndpoint.Port is 0)\n")
    assert not [p for _, p, _ in Api.seen if p.endswith("/log")]


def test_an_unknown_node_is_bad_input(api_client: Any, tmp_path: Path) -> None:
    with pytest.raises(BundleInputError, match=r"node gpu-9: HTTP 404 .*no such node in the cluster"):
        collect_kubernetes(api_client, "gpu-9", tmp_path, SANDBOX_CAPS)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(("status", "why"), [
    ({"addresses": [{"type": "InternalIP", "address": "10.0.3.3"}],
      "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}, None),
    ({"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}, "kubeletEndpoint.Port is 0"),
    ({"addresses": [{"type": "Hostname", "address": "gpu-3"}],
      "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}, "no InternalIP address"),
])
def test_whether_the_api_server_can_read_a_nodes_logs(status: dict[str, Any], why: str | None) -> None:
    said = no_kubelet_endpoint({"status": status})
    assert said == why if why is None else why in (said or "")
