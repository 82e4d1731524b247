"""The Kubernetes backend against a local HTTP server that checks the exact requests (no API
server can be installed on these machines)."""

from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.chaos.ledger import Ledger
from gpufleet.chaos.node import actions as node_actions
from gpufleet.chaos.node import probes as node_probes

STRATEGIC = "application/strategic-merge-patch+json"


def _node(name: str, unschedulable: bool = False, ready: bool = True, taints: Any = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {}},
        "spec": {"unschedulable": unschedulable, **({"taints": taints} if taints else {})},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        },
    }


def _cfg(s: Any, tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {
        "gpufleet_backend": "kubernetes",
        "gpufleet_stack": "h200-ib",
        "gpufleet_k8s_host": s.url,
        "gpufleet_k8s_image": "ghcr.io/gpufleet/gpufleet:test",
        "gpufleet_allow_production": True,
        "gpufleet_ledger": str(tmp_path / "faults.jsonl"),
        **kw,
    }


def _serve_nodes(s: Any, *nodes: dict[str, Any]) -> None:
    s.responses[("GET", "/api/v1/nodes")] = (
        200,
        {"apiVersion": "v1", "kind": "NodeList", "items": list(nodes)},
    )
    for n in nodes:
        s.responses[("GET", f"/api/v1/nodes/{n['metadata']['name']}")] = (200, n)
        s.responses[("PATCH", f"/api/v1/nodes/{n['metadata']['name']}")] = (200, n)


def test_cordon_sends_a_strategic_merge_patch_and_rollback_uncordons(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    out = node_actions.cordon_node("gpu-0001", configuration=_cfg(api_server, tmp_path))
    patches = [r for r in api_server.requests if r["method"] == "PATCH"]
    assert patches == [
        {
            "method": "PATCH",
            "path": "/api/v1/nodes/gpu-0001",
            "query": "",
            "content_type": STRATEGIC,
            "body": {"spec": {"unschedulable": True}},
        }
    ]
    led = Ledger(tmp_path / "faults.jsonl")
    assert [r.id for r in led.pending()] == [out["id"]]
    node_actions.restore_node(configuration=_cfg(api_server, tmp_path))
    patches = [r for r in api_server.requests if r["method"] == "PATCH"]
    assert patches[-1]["body"] == {"spec": {"unschedulable": False}}
    assert patches[-1]["content_type"] == STRATEGIC
    assert led.pending() == []


def test_taint_is_read_modify_write_of_the_whole_list(api_server: Any, tmp_path: Path) -> None:
    existing = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    _serve_nodes(api_server, _node("gpu-0001", taints=existing), _node("gpu-0002"))
    node_actions.taint_node(
        "gpu-0001", "gpufleet.io/chaos", "xid79", "NoExecute", configuration=_cfg(api_server, tmp_path)
    )
    reqs = [(r["method"], r["path"]) for r in api_server.requests]
    assert ("GET", "/api/v1/nodes/gpu-0001") in reqs
    patch = [r for r in api_server.requests if r["method"] == "PATCH"][-1]
    assert patch["content_type"] == STRATEGIC
    assert patch["body"] == {
        "spec": {
            "taints": [
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": "gpufleet.io/chaos", "value": "xid79", "effect": "NoExecute"},
            ]
        }
    }
    node_actions.restore_node(configuration=_cfg(api_server, tmp_path))
    untaint = [r for r in api_server.requests if r["method"] == "PATCH"][-1]
    assert untaint["body"] == {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}


def test_eviction_uses_policy_v1(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"))
    path = "/api/v1/namespaces/train/pods/worker-0/eviction"
    api_server.responses[("POST", path)] = (201, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
    node_actions.evict_pod("worker-0", "train", grace_seconds=30, configuration=_cfg(api_server, tmp_path))
    req = next(r for r in api_server.requests if r["method"] == "POST")
    assert req["path"] == path
    assert req["content_type"] == "application/json"
    assert req["body"] == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "worker-0", "namespace": "train"},
        "deleteOptions": {"gracePeriodSeconds": 30},
    }


def test_gpu_fault_runs_a_privileged_pod_pinned_to_the_node(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    api_server.responses[("POST", "/api/v1/namespaces/gpufleet-gameday/pods")] = (201, {"kind": "Pod"})
    from gpufleet.chaos.gpu import actions as gpu_actions

    gpu_actions.inject_gpu_fault("gpu-xid-79", "gpu-0001", 3, configuration=_cfg(api_server, tmp_path))
    pod = next(r for r in api_server.requests if r["method"] == "POST")
    assert pod["path"] == "/api/v1/namespaces/gpufleet-gameday/pods"
    assert pod["content_type"] == "application/json"
    body = pod["body"]
    assert body["spec"]["nodeName"] == "gpu-0001"
    assert body["spec"]["hostPID"] is True and body["spec"]["restartPolicy"] == "Never"
    c = body["spec"]["containers"][0]
    assert c["securityContext"] == {"privileged": True}
    assert c["image"] == "ghcr.io/gpufleet/gpufleet:test"
    script = c["command"][2]
    assert script.startswith("dcgmi test --inject --gpuid 3 -f 230 -v 79 && ")
    assert "NVRM: Xid (PCI:0000:03:00): 79, pid=0" in script and "/dev/kmsg" in script
    assert body["spec"]["volumes"] == [
        {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}
    ]


def test_production_stack_needs_the_opt_in(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    cfg = _cfg(api_server, tmp_path, gpufleet_allow_production=False)
    with pytest.raises(InvalidActivity, match="production"):
        node_actions.cordon_node("gpu-0001", configuration=cfg)
    assert [r for r in api_server.requests if r["method"] == "PATCH"] == []
    assert Ledger(tmp_path / "faults.jsonl").records() == []


def test_blast_radius_counts_nodes_already_not_ready(api_server: Any, tmp_path: Path) -> None:
    # h200-ib allows gameday.maxNodesDown 1: with one node NotReady, cordoning another is refused.
    _serve_nodes(api_server, _node("gpu-0001", ready=False), _node("gpu-0002"))
    cfg = _cfg(api_server, tmp_path)
    assert node_probes.blast_radius_allows(["gpu-0002"], configuration=cfg) is False
    with pytest.raises(InvalidActivity, match="maxNodesDown=1"):
        node_actions.cordon_node("gpu-0002", configuration=cfg)
    assert [r for r in api_server.requests if r["method"] == "PATCH"] == []


def test_api_errors_become_activity_failures(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    api_server.responses[("PATCH", "/api/v1/nodes/gpu-0001")] = (
        403,
        {"kind": "Status", "reason": "Forbidden"},
    )
    with pytest.raises(ActivityFailed, match="403"):
        node_actions.cordon_node("gpu-0001", configuration=_cfg(api_server, tmp_path))
    # The failed apply was undone at once (rollback tried) and is recorded as such.
    led = Ledger(tmp_path / "faults.jsonl")
    assert len(led.records()) == 1 and len(led.reverts()) == 1


# ----------------------------------------------------------------------------- simulated (kwok) nodes

KWOK = {"kwok.x-k8s.io/node": "fake"}
LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-0001"
MERGE = "application/merge-patch+json"


def _sim(name: str, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    n = _node(name)
    n["metadata"]["annotations"] = dict(KWOK)
    n["status"]["conditions"] += conditions or []
    return n


def _status_patches(s: Any) -> list[dict[str, Any]]:
    return [r for r in s.requests if r["method"] == "PATCH" and r["path"].endswith("/status")]


def test_a_gpu_fault_on_a_simulated_node_is_the_node_health_condition(
    api_server: Any, tmp_path: Path
) -> None:
    """No container runs on a kwok node: the XID is surfaced as node-problem-detector surfaces the
    generated check's verdict, on nodes/status; the rollback puts the healthy condition back."""
    from gpufleet.chaos.gpu import actions as gpu_actions

    _serve_nodes(api_server, _sim("gpu-0001"), _sim("gpu-0002"))
    api_server.responses[("PATCH", "/api/v1/nodes/gpu-0001/status")] = (200, _sim("gpu-0001"))
    cfg = _cfg(api_server, tmp_path)
    out = gpu_actions.inject_gpu_fault("gpu-xid-79", "gpu-0001", 3, configuration=cfg)
    assert [r for r in api_server.requests if r["method"] == "POST"] == []  # no fault pod
    (patch,) = _status_patches(api_server)
    assert patch["content_type"] == STRATEGIC
    (cond,) = patch["body"]["status"]["conditions"]
    assert {k: cond[k] for k in ("type", "status", "reason", "message")} == {
        "type": "GpuFleetProblem", "status": "True", "reason": "GpuFleetCheckFailed",
        "message": "PROBLEM: XID 79 on GPU 0000:03:00 (action isolates the node)",
    }
    rec = Ledger(tmp_path / "faults.jsonl").pending()[0]
    assert rec.id == out["id"] and rec.params["node_kind"] == "simulated"
    assert rec.rollback.name == "kubernetes.node-condition" and rec.params["takes_node_down"] is True
    gpu_actions.clear_gpu_faults(configuration=cfg)
    restored = _status_patches(api_server)[-1]["body"]["status"]["conditions"][0]
    assert (restored["status"], restored["reason"]) == ("False", "GpuFleetHealthy")


def test_the_check_passes_for_an_xid_the_policy_does_not_isolate_for(api_server: Any, tmp_path: Path) -> None:
    from gpufleet.chaos.gpu import actions as gpu_actions

    _serve_nodes(api_server, _sim("gpu-0001"), _sim("gpu-0002"))
    api_server.responses[("PATCH", "/api/v1/nodes/gpu-0001/status")] = (200, _sim("gpu-0001"))
    gpu_actions.inject_gpu_fault("gpu-xid-94", "gpu-0001", 0, configuration=_cfg(api_server, tmp_path))
    cond = _status_patches(api_server)[0]["body"]["status"]["conditions"][0]
    assert (cond["status"], cond["message"]) == ("False", "gpufleet node-health checks pass")


def test_a_dcgm_field_a_simulated_node_cannot_show_is_refused(api_server: Any, tmp_path: Path) -> None:
    from gpufleet.chaos.gpu import actions as gpu_actions

    _serve_nodes(api_server, _sim("gpu-0001"), _sim("gpu-0002"))
    with pytest.raises(InvalidActivity, match=r"simulated \(kwok\).*\(DCGM field 395 cannot\)"):
        gpu_actions.inject_gpu_fault("gpu-xid-64", "gpu-0001", 0, configuration=_cfg(api_server, tmp_path))
    assert [r for r in api_server.requests if r["method"] in ("PATCH", "POST")] == []
    assert Ledger(tmp_path / "faults.jsonl").records() == []


def test_a_simulated_node_crash_takes_its_lease_over_and_the_rollback_releases_it(
    api_server: Any, tmp_path: Path
) -> None:
    _serve_nodes(api_server, _sim("gpu-0001"), _sim("gpu-0002"))
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "gpu-0001", "namespace": "kube-node-lease"},
             "spec": {"holderIdentity": "kwok-1", "leaseDurationSeconds": 40,
                      "renewTime": "2026-01-01T00:00:00.000000Z"}}
    api_server.responses[("GET", LEASE)] = (200, lease)
    api_server.responses[("PATCH", LEASE)] = (200, lease)
    cfg = _cfg(api_server, tmp_path)
    node_actions.crash_node("gpu-0001", configuration=cfg)
    (take,) = [r for r in api_server.requests if r["method"] == "PATCH"]
    assert take["path"] == LEASE and take["content_type"] == MERGE
    spec = take["body"]["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("gpufleet-chaos/node-crash", 86400)
    assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]  # a MicroTime: one last renewal
    rec = Ledger(tmp_path / "faults.jsonl").pending()[0]
    assert rec.params["node_kind"] == "simulated" and rec.params["holder_before"] == "kwok-1"
    node_actions.restore_node(configuration=cfg)
    release = [r for r in api_server.requests if r["method"] == "PATCH"][-1]
    released = {"spec": {"holderIdentity": "gpufleet-chaos/released", "leaseDurationSeconds": 1}}
    assert release["body"] == released


def test_a_real_node_crash_is_sysrq_from_a_privileged_pod(api_server: Any, tmp_path: Path) -> None:
    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    api_server.responses[("POST", "/api/v1/namespaces/gpufleet-gameday/pods")] = (201, {"kind": "Pod"})
    node_actions.crash_node("gpu-0001", configuration=_cfg(api_server, tmp_path))
    pod = next(r for r in api_server.requests if r["method"] == "POST")["body"]
    assert pod["spec"]["nodeName"] == "gpu-0001" and pod["spec"]["hostPID"] is True
    assert "echo b > /proc/sysrq-trigger" in pod["spec"]["containers"][0]["command"][2]
    assert Ledger(tmp_path / "faults.jsonl").pending()[0].params["node_kind"] == "real"


def test_a_fabric_port_down_on_a_simulated_node_is_the_checks_fabric_problem(
    api_server: Any, tmp_path: Path
) -> None:
    from gpufleet.chaos.fabric import actions as fabric_actions

    _serve_nodes(api_server, _sim("gpu-0001"), _sim("gpu-0002"))
    api_server.responses[("PATCH", "/api/v1/nodes/gpu-0001/status")] = (200, _sim("gpu-0001"))
    fabric_actions.link_down("gpu-0001", 1, configuration=_cfg(api_server, tmp_path))
    cond = _status_patches(api_server)[0]["body"]["status"]["conditions"][0]
    assert cond["message"] == "PROBLEM: fabric port(s) not ACTIVE: ib1/1"


def test_the_training_jobs_pods_name_the_job_nodes(api_server: Any, tmp_path: Path) -> None:
    from gpufleet.chaos import engine

    def pod(i: int, node: str, phase: str = "Running", ready: bool = True, deleting: bool = False) -> Any:
        index = {"batch.kubernetes.io/job-completion-index": str(i)}
        meta: dict[str, Any] = {"name": f"t-{i}", "annotations": index}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node}, "status": {
            "phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    _serve_nodes(api_server, _node("gpu-0001"), _node("gpu-0002"))
    api_server.responses[("GET", "/apis/batch/v1/namespaces/train/jobs/llm")] = (
        200, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llm"},
              "spec": {"parallelism": 3}}
    )
    api_server.responses[("GET", "/api/v1/namespaces/train/pods")] = (200, {"kind": "PodList", "items": [
        pod(1, "gpu-0002"), pod(0, "gpu-0001"), pod(2, "gpu-0003", ready=False),
        pod(2, "gpu-0004", "Pending"), pod(3, "gpu-0005", deleting=True)]})
    cfg = _cfg(api_server, tmp_path, gpufleet_k8s_training_job="train/llm")
    b = engine.context(cfg).backend()
    pods = b.training_pods()
    assert pods is not None
    assert (pods.job, pods.wanted, pods.running, pods.pending) == ("train/llm", 3, 2, 1)
    assert b.job_nodes() == ["gpu-0001", "gpu-0002"]  # by completion index
    listed = next(r for r in api_server.requests if r["path"] == "/api/v1/namespaces/train/pods")
    assert listed["query"] == "labelSelector=job-name%3Dllm"
    with pytest.raises(InvalidActivity, match="gpufleet_k8s_training_job must be <namespace>/<name>"):
        engine.context(_cfg(api_server, tmp_path, gpufleet_k8s_training_job="llm")).backend()


def test_node_observations_from_conditions_and_taints() -> None:
    from gpufleet.chaos.backends.kubernetes import node_obs

    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ok = node_obs(_node("a", taints=[gpu_taint]))
    assert ok.schedulable and not ok.problem and ok.reason == ""
    sick = _node("a", taints=[gpu_taint])
    problem = {"type": "GpuFleetProblem", "status": "True", "message": "PROBLEM: XID 79",
               "lastTransitionTime": "2026-01-01T00:00:05Z"}
    sick["status"]["conditions"].append(problem)
    o = node_obs(sick)
    assert o.schedulable and o.problem and o.problem_since == 1767225605.0
    assert o.reason == "GpuFleetProblem: PROBLEM: XID 79"
    quarantined = _node("a", unschedulable=True, taints=[gpu_taint, {"key": "gpufleet.io/quarantine",
                                                                     "effect": "NoSchedule"}])
    q = node_obs(quarantined)
    assert not q.schedulable and q.state == "cordoned+tainted" and q.reason == "taint gpufleet.io/quarantine"
    lost = node_obs(_node("a", ready=False))
    assert not lost.schedulable and lost.problem and lost.reason_time == lost.problem_since == 1767225600.0
    soft = [{"key": "node.kubernetes.io/unreachable", "effect": "PreferNoSchedule"}]
    prefer = node_obs(_node("a", taints=soft))
    assert prefer.schedulable


# --------------------------------------------------------------------- sandbox kubelet nodes


def _kubelet_node(name: str) -> dict[str, Any]:
    n = _node(name)
    n["metadata"]["labels"]["gpufleet.io/kubelet-node"] = "true"
    return n


def test_no_fault_pod_goes_to_a_sandbox_kubelet_node(api_server: Any, tmp_path: Path) -> None:
    # Its containers share this machine's PID namespace: sysrq-b from there would reboot the machine.
    _serve_nodes(api_server, _kubelet_node("gpu-0"), _node("gpu-1"))
    api_server.responses[("POST", "/api/v1/namespaces/gpufleet-gameday/pods")] = (201, {"kind": "Pod"})
    with pytest.raises(InvalidActivity, match=r"kubelet node of the Kubernetes sandbox.*machine itself"):
        node_actions.crash_node("gpu-0", configuration=_cfg(api_server, tmp_path))
    from gpufleet.chaos.gpu import actions as gpu_actions

    # Without its agent (a configuration naming the API server, not the sandbox), a GPU fault there
    # would be a pod too: refused the same way.
    with pytest.raises(InvalidActivity, match="kubelet node of the Kubernetes sandbox"):
        gpu_actions.inject_gpu_fault("gpu-xid-79", "gpu-0", 3, configuration=_cfg(api_server, tmp_path))
    assert not [r for r in api_server.requests if r["method"] == "POST"]
    assert Ledger(tmp_path / "faults.jsonl").pending() == []


class _Agent:
    """The agent's control API on a unix socket: records each request and its bearer token."""

    def __init__(self, path: Path) -> None:
        import http.server
        import socketserver
        import threading

        self.requests: list[tuple[str, str, Any, str]] = []
        seen = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import json

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(("POST", self.path, body, self.headers.get("Authorization", "")))
                out = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def get_request(self) -> Any:
                conn, _ = super().get_request()
                return conn, ("agent", 0)

        self.server = Server(str(path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_gpu_fault_on_a_sandbox_kubelet_node_goes_through_its_agent(
    api_server: Any, tmp_path: Path
) -> None:
    from gpufleet.catalog.injection import DcgmInject
    from gpufleet.chaos.backends.kubernetes import KubernetesBackend, connection
    from gpufleet.chaos.rollbacks import ROLLBACKS

    _serve_nodes(api_server, _kubelet_node("gpu-0"))
    sock, token = tmp_path / "agent.sock", tmp_path / "agent.token"
    token.write_text("s3cret\n")
    agent = _Agent(sock)
    try:
        backend = KubernetesBackend(connection(api_server.url, None, None), "gpufleet-gameday", "img:1",
                                    "fab{rail}", None, agents={"gpu-0": (str(sock), str(token))})
        plan = backend.plan_dcgm_inject("gpu-0", 3, DcgmInject(field_id=230, value=79, kmsg=True))
        assert plan.params["node_kind"] == "sandbox-kubelet" and plan.target == {"node": "gpu-0", "gpu": 3}
        assert plan.rollback.name == "sandbox.agent-clear"
        plan.apply()
        ROLLBACKS[plan.rollback.name](plan.rollback.args)
    finally:
        agent.close()
    assert agent.requests == [
        ("POST", "/inject", {"gpu": 3, "field_id": 230, "value": 79, "kmsg": True, "burst": 1},
         "Bearer s3cret"),
        ("POST", "/clear", {"gpu": 3}, "Bearer s3cret"),
    ]
    assert not [r for r in api_server.requests if r["method"] == "POST"]  # no pod
