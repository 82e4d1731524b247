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
