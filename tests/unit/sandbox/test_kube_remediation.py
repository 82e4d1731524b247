"""The Kubernetes sandbox's remediation (the stand-in for NVSentinel's quarantine and drain): the pure
decision on tables of node views, the patches it sends, and one reconcile against a recording API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.catalog.policy import OverrideSpec
from gpufleet.config import load_named_stack
from gpufleet.core.node_health import (
    CONDITION,
    OUT_OF_SERVICE_TAINT,
    QUARANTINE_ANNOTATION,
    QUARANTINE_TAINT,
    fabric_problem_message,
    xid_problem_message,
)
from gpufleet.core.sandbox_contract import RemediationStatus
from gpufleet.core.taxonomy import LadderAction
from gpufleet.sandbox.kube import remediation as rem
from gpufleet.sandbox.kube.cluster import remediation_argv, remediation_policy_doc
from gpufleet.sandbox.kube.daemons import KubeLayout, free_ports

REPO = Path(__file__).resolve().parents[3]
CATALOG = load_catalog()
NOW = 1_000_000.0
UNREACHABLE = "node.kubernetes.io/unreachable"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def policy(mode: str = "cordon-drain-remediate", share: float = 0.5, window_s: float = 300.0,
           overrides: dict[int, OverrideSpec] | None = None) -> rem.Policy:
    table, problems = xid_policy(CATALOG, overrides or {})
    assert problems == []
    actions = {f: CATALOG.get(f).action for f in (rem.FABRIC_FAULT, rem.NODE_LOST_FAULT)}
    return rem.Policy(mode, share, window_s, table, actions)


def view(name: str, ready: str = "True", problem: str | None = None, unschedulable: bool = False,
         taints: tuple[tuple[str, str], ...] = (), quarantine: rem.Quarantine | None = None) -> rem.NodeView:
    return rem.NodeView(name, ready, problem, unschedulable, taints, quarantine)


XID79 = xid_problem_message(79, "0000:00:00")


# ----------------------------------------------------------------------------- diagnose


@pytest.mark.parametrize(("node", "fault", "action", "lost"), [
    (view("a", problem=XID79), "gpu-xid-79", LadderAction.REBOOT_NODE, False),
    (view("a", problem=xid_problem_message(48, "0000:01:00")), "gpu-xid-48", LadderAction.RESET_GPU, False),
    (view("a", problem=fabric_problem_message(["ib0/1"])), "fabric-port-down", LadderAction.REBOOT_NODE,
     False),
    (view("a", ready="Unknown"), "node-crash", LadderAction.REBOOT_NODE, True),
    (view("a", problem="PROBLEM: something new"), rem.UNRECOGNISED, LadderAction.RESET_GPU, False),
])
def test_diagnose_from_the_condition_and_the_catalog(
    node: rem.NodeView, fault: str, action: LadderAction, lost: bool
) -> None:
    f = rem.diagnose(node, policy())
    assert f is not None and (f.fault, f.action, f.lost) == (fault, action, lost)


def test_a_healthy_or_merely_not_ready_node_has_no_finding() -> None:
    assert rem.diagnose(view("a"), policy()) is None
    # NotReady posted by a live kubelet (False) is the kubelet's business; only a lost one (Unknown) is ours.
    assert rem.diagnose(view("a", ready="False"), policy()) is None
    assert rem.diagnose(view("a", ready=""), policy()) is None  # not joined yet


def test_the_stacks_xid_override_decides() -> None:
    milder = policy(overrides={48: OverrideSpec(LadderAction.REPLACE, "RMA on the first one")})
    f = rem.diagnose(view("a", problem=xid_problem_message(48, "0000:01:00")), milder)
    assert f is not None and f.action is LadderAction.REPLACE and "stack override" in f.why


# ----------------------------------------------------------------------------- decide


def test_each_mode_does_what_nvsentinel_does() -> None:
    nodes = [view("a", problem=XID79), view("b"), view("c"), view("d")]
    watch = rem.decide(nodes, policy("monitor-only"), [], NOW)
    assert (watch.quarantine, watch.drain) == ((), ())
    assert watch.notes == ("a: would quarantine for gpu-xid-79 (monitor-only)",)
    cordon = rem.decide(nodes, policy("cordon"), [], NOW)
    assert [n for n, _ in cordon.quarantine] == ["a"] and cordon.drain == () and cordon.fence == ()
    full = rem.decide(nodes, policy("cordon-drain-remediate"), [], NOW)
    assert [n for n, _ in full.quarantine] == ["a"] and full.drain == ("a",) and full.fence == ()


def test_a_node_held_by_a_rolling_upgrade_is_left_to_the_rollout() -> None:
    """The GPU Operator upgrade driver marks the node it takes (core.maintenance): remediation sees
    the same fault, says so, and stands aside; the rollout's health read handles it (one actor)."""
    from gpufleet.core.maintenance import held_reason, upgrade_reason

    mark = upgrade_reason("sandbox-1", "driver", "570.124.06")
    held = rem.NodeView("a", "True", XID79, True, (), None, mark)
    d = rem.decide([held, view("b")], policy(), [], NOW)
    assert (d.quarantine, d.drain) == ((), ())
    assert d.notes == (f"a: gpu-xid-79: stood aside, held by a rolling upgrade ({mark})",)
    # A node the rollout gave up on stays the people's (held); a mark of something else does not count.
    given_up = rem.NodeView("a", "True", XID79, True, (), None, held_reason("gate failed"))
    assert rem.decide([given_up], policy(), [], NOW).quarantine == ()
    other = rem.NodeView("a", "True", XID79, False, (), None, "someone's note")
    assert [n for n, _ in rem.decide([other], policy(), [], NOW).quarantine] == ["a"]
    node = {"metadata": {"name": "a", "annotations": {"gpufleet.io/maintenance": mark}},
            "spec": {"unschedulable": True}, "status": {}}
    assert rem.node_view(node).maintenance == mark


def test_a_lost_node_is_fenced_out_of_service_in_drain_mode_only() -> None:
    nodes = [view("a", ready="Unknown", taints=(("node.kubernetes.io/unreachable", "NoExecute"),)), view("b")]
    d = rem.decide(nodes, policy(), [], NOW)
    assert [n for n, _ in d.quarantine] == ["a"] and d.fence == ("a",) and d.drain == ("a",)
    assert rem.decide(nodes, policy("cordon"), [], NOW).fence == ()
    # Quarantined before it was lost (a GPU fault, then the node died): fenced now, once.
    q = rem.Quarantine("gpu-xid-79", True, NOW - 10)
    later = [view("a", ready="Unknown", quarantine=q), view("b")]
    assert rem.decide(later, policy(), [(NOW - 10, "a")], NOW).fence == ("a",)
    fenced = [view("a", ready="Unknown", quarantine=q, taints=((OUT_OF_SERVICE_TAINT, "NoExecute"),))]
    assert rem.decide(fenced, policy(), [(NOW - 10, "a")], NOW).fence == ()


def test_an_action_that_does_not_isolate_is_left_alone() -> None:
    gentle = policy(overrides={79: OverrideSpec(LadderAction.REBOOT_NODE, "x")})
    nodes = [view("a", problem=xid_problem_message(13, "0000:00:00")), view("b")]
    d = rem.decide(nodes, gentle, [], NOW)  # XID 13's catalog action is restart-job
    assert d.quarantine == () and d.notes == (
        "a: gpu-xid-13 (PROBLEM: XID 13 on GPU 0000:00:00 (action isolates the node) (catalog)): action "
        "restart-job does not isolate the node",
    )


def test_release_only_what_this_remediation_quarantined() -> None:
    q = rem.Quarantine("gpu-xid-79", True, NOW - 100)
    nodes = [view("a", unschedulable=True, quarantine=q), view("b", unschedulable=True)]  # b: a user's cordon
    assert rem.decide(nodes, policy(), [], NOW).release == ("a",)
    still = [view("a", problem=XID79, unschedulable=True, quarantine=q)]
    d = rem.decide(still, policy(), [], NOW)
    assert d.release == () and d.drain == ("a",) and d.quarantine == ()


def test_drains_stop_after_the_timeout() -> None:
    q = rem.Quarantine("gpu-xid-79", True, NOW - rem.DRAIN_TIMEOUT_S - 1)
    assert rem.decide([view("a", problem=XID79, quarantine=q)], policy(), [], NOW).drain == ()


@pytest.mark.parametrize(("nodes", "share", "threshold"), [
    (3, 0.5, 2), (5, 0.5, 3), (6, 0.5, 3), (1250, 0.02, 25), (1280, 0.02, 26), (10, 0.001, 1),
])
def test_breaker_threshold_rounds_as_nvsentinel(nodes: int, share: float, threshold: int) -> None:
    assert policy(share=share).breaker_threshold(nodes) == threshold


def test_the_circuit_breaker_trips_at_the_threshold_within_the_window() -> None:
    nodes = [view(n, problem=XID79) for n in ("a", "b", "c")]
    d = rem.decide(nodes, policy(share=0.5), [], NOW)  # threshold 2 of 3 nodes
    assert [n for n, _ in d.quarantine] == ["a", "b"] and d.breaker_open
    assert d.notes == ("c: not quarantined for gpu-xid-79: circuit breaker tripped (2 nodes quarantined "
                       "within 5 min, threshold 2)",)
    # Quarantines older than the window no longer count.
    one = [view("c", problem=XID79), view("d"), view("e")]
    assert [n for n, _ in rem.decide(one, policy(share=0.5), [(NOW - 301, "a"), (NOW - 400, "b")],
                                     NOW).quarantine] == ["c"]
    assert rem.decide(one, policy(share=0.5), [(NOW - 60, "a"), (NOW - 30, "b")], NOW).quarantine == ()


# ----------------------------------------------------------------------------- patches


def node_obj(name: str, taints: list[dict[str, str]], unschedulable: bool = False,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "42", "annotations": annotations or {}},
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_quarantine_then_release_restores_the_node() -> None:
    finding = rem.Finding("gpu-xid-79", LadderAction.REBOOT_NODE, False, XID79)
    n = node_obj("a", [GPU_TAINT])
    patch = rem.quarantine_patch(n, finding, NOW, fence=False)
    assert patch["metadata"]["resourceVersion"] == "42"  # a concurrent change wins, the next round retries
    assert patch["spec"] == {"unschedulable": True, "taints": [
        GPU_TAINT, {"key": QUARANTINE_TAINT, "value": "gpu-xid-79", "effect": "NoSchedule"}]}
    q = json.loads(patch["metadata"]["annotations"][QUARANTINE_ANNOTATION])
    assert q == {"fault": "gpu-xid-79", "cordoned": True, "at": NOW, "fenced": False}
    quarantined = node_obj("a", patch["spec"]["taints"], True, patch["metadata"]["annotations"])
    assert rem.release_patch(quarantined) == {
        "metadata": {"resourceVersion": "42", "annotations": {QUARANTINE_ANNOTATION: None}},
        "spec": {"taints": [GPU_TAINT], "unschedulable": False},
    }


def test_a_node_cordoned_before_stays_cordoned_and_out_of_service_is_lifted_only_if_ours() -> None:
    finding = rem.Finding("node-crash", LadderAction.REBOOT_NODE, True, "lost")
    n = node_obj("a", [GPU_TAINT, {"key": UNREACHABLE, "effect": "NoExecute"}], True)
    patch = rem.quarantine_patch(n, finding, NOW, fence=True)
    keys = [t["key"] for t in patch["spec"]["taints"]]
    assert keys == ["nvidia.com/gpu", UNREACHABLE, QUARANTINE_TAINT, OUT_OF_SERVICE_TAINT]
    oos = {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}
    assert patch["spec"]["taints"][-1] == oos
    after = node_obj("a", patch["spec"]["taints"], True, patch["metadata"]["annotations"])
    released = rem.release_patch(after)
    assert "unschedulable" not in released["spec"]  # it was cordoned before the quarantine
    assert [t["key"] for t in released["spec"]["taints"]] == ["nvidia.com/gpu", UNREACHABLE]


@pytest.mark.parametrize(("pod", "evict"), [
    ({"metadata": {"name": "p"}, "status": {"phase": "Running"}}, True),
    ({"metadata": {"name": "p", "ownerReferences": [{"kind": "DaemonSet"}]}, "status": {"phase": "Running"}},
     False),
    ({"metadata": {"name": "p", "annotations": {"kubernetes.io/config.mirror": "x"}}, "status": {}}, False),
    ({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}},
     False),
    ({"metadata": {"name": "p"}, "status": {"phase": "Failed"}}, False),
])
def test_evictable_as_kubectl_drain(pod: dict[str, Any], evict: bool) -> None:
    assert rem.evictable(pod) is evict


# ----------------------------------------------------------------------------- policy file and argv


def test_policy_file_from_the_stack(tmp_path: Path) -> None:
    spec = load_named_stack("sandbox", REPO / "stacks")
    doc = remediation_policy_doc(spec)
    assert doc["mode"] == "cordon-drain-remediate"
    assert doc["circuitBreaker"] == {"maxQuarantinedShare": 0.5, "windowMinutes": 5}
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({**doc, "xidOverrides": {"48": {"action": "replace", "reason": "RMA"}}}))
    p = rem.load_policy(f)
    assert (p.mode, p.max_quarantined_share, p.window_s) == ("cordon-drain-remediate", 0.5, 300.0)
    assert p.xids[48].action is LadderAction.REPLACE and p.xids[79].action is LadderAction.REBOOT_NODE
    f.write_text(json.dumps({**doc, "mode": "reboot-everything"}))
    with pytest.raises(ValueError, match="mode 'reboot-everything' is not one of"):
        rem.load_policy(f)


def test_the_process_names_the_run_directory(tmp_path: Path) -> None:
    lay = KubeLayout("sandbox", "r1", tmp_path / "run-r1", free_ports())
    argv = remediation_argv(lay)
    assert argv[1:3] == ["-m", "gpufleet.sandbox.kube.remediation"]
    assert all(str(lay.base_dir) in a for a in argv[3:])  # `down` finds it by the run directory


# ----------------------------------------------------------------------------- one reconcile


class RecordingApi:
    """Answers like the API server: PATCH returns the patched node, evictions 201 or 429."""

    def __init__(self, pods: list[dict[str, Any]], eviction_status: int = 201) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.pods = pods
        self.eviction_status = eviction_status

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: Any = None) -> httpx.Response:
        self.calls.append((method, path, body))
        if method == "PATCH":
            return httpx.Response(200, json={"metadata": {"name": path.rsplit("/", 1)[1]}})
        return httpx.Response(self.eviction_status, json={"kind": "Status"})

    def get(self, path: str, params: Any = None) -> Any:
        self.calls.append(("GET", path, params))
        return {"items": self.pods}


def test_reconcile_quarantines_drains_and_writes_its_status(tmp_path: Path) -> None:
    sick = node_obj("gpu-0", [GPU_TAINT])
    sick["status"]["conditions"].append({"type": CONDITION, "status": "True", "message": XID79})
    pod = {"metadata": {"name": "train-0", "namespace": "default"}, "status": {"phase": "Running"}}
    api = RecordingApi([pod])
    ctl = rem.Controller(api, policy(), tmp_path / "status.json")
    ctl.nodes = {"gpu-0": sick, "gpu-1": node_obj("gpu-1", [GPU_TAINT])}
    d = ctl.reconcile(NOW)
    assert [n for n, _ in d.quarantine] == ["gpu-0"]
    assert [(m, p) for m, p, _ in api.calls] == [
        ("PATCH", "/api/v1/nodes/gpu-0"), ("GET", "/api/v1/pods"),
        ("POST", "/api/v1/namespaces/default/pods/train-0/eviction"),
    ]
    assert api.calls[1][2] == {"fieldSelector": "spec.nodeName=gpu-0"}
    assert api.calls[2][2] == {"apiVersion": "policy/v1", "kind": "Eviction",
                               "metadata": {"name": "train-0", "namespace": "default"}}
    assert ctl.recent == [(NOW, "gpu-0")]
    status = RemediationStatus.model_validate_json((tmp_path / "status.json").read_text())
    assert status.mode == "cordon-drain-remediate" and not status.breaker_open


def test_a_pdb_refusal_is_retried_and_said(tmp_path: Path) -> None:
    q = rem.Quarantine("gpu-xid-79", True, NOW - 5)
    sick = node_obj("gpu-0", [GPU_TAINT], True, {QUARANTINE_ANNOTATION: q.to_json()})
    sick["status"]["conditions"].append({"type": CONDITION, "status": "True", "message": XID79})
    pod = {"metadata": {"name": "train-0", "namespace": "default"}, "status": {"phase": "Running"}}
    ctl = rem.Controller(RecordingApi([pod], eviction_status=429), policy(), tmp_path / "status.json")
    ctl.nodes = {"gpu-0": sick}
    ctl.reconcile(NOW)
    status = RemediationStatus.model_validate_json((tmp_path / "status.json").read_text())
    assert status.quarantined == {"gpu-0": "gpu-xid-79"}
    assert status.notes == [
        "gpu-0: eviction of default/train-0 refused for now (PodDisruptionBudget); retrying"
    ]


def _sick(name: str) -> dict[str, Any]:
    n = node_obj(name, [GPU_TAINT])
    n["status"]["conditions"].append({"type": CONDITION, "status": "True", "message": XID79})
    return n


def test_the_before_quarantine_hook_runs_first_with_the_node_and_its_fault(tmp_path: Path) -> None:
    """The hook (the sandbox's: the node's bundle) sees the node before the quarantine patch; every
    node of the round gets its own run, at once."""
    seen = tmp_path / "seen"
    hook = tmp_path / "hook.py"
    hook.write_text(f"import sys\nwith open({str(seen)!r}, 'a') as f:\n"
                    "    f.write(' '.join(sys.argv[1:]) + '\\n')\n")

    class Checking(RecordingApi):
        def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                    params: Any = None) -> httpx.Response:
            if method == "PATCH":  # both hooks have run by the first quarantine
                assert len(seen.read_text().splitlines()) == 2
            return super().request(method, path, body, content_type, params)

    api = Checking([])
    ctl = rem.Controller(api, policy(), None, before_quarantine=(sys.executable, str(hook)))
    ctl.nodes = {"gpu-0": _sick("gpu-0"), "gpu-1": _sick("gpu-1"), "gpu-2": node_obj("gpu-2", [GPU_TAINT])}
    d = ctl.reconcile(NOW)
    assert sorted(n for n, _ in d.quarantine) == ["gpu-0", "gpu-1"]
    assert sorted(seen.read_text().splitlines()) == [
        f"--node gpu-{i} --reason gpu-xid-79 --detected-at {NOW:.3f}" for i in (0, 1)]
    assert [m for m, _, _ in api.calls].count("PATCH") == 2


def test_a_hook_that_hangs_is_killed_at_its_bound_and_the_node_quarantined(
        caplog: pytest.LogCaptureFixture) -> None:
    api = RecordingApi([])
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    ctl = rem.Controller(api, policy(), None, before_quarantine=sleeper, hook_timeout_s=0.5)
    ctl.nodes = {"gpu-0": _sick("gpu-0")}
    with caplog.at_level("WARNING", logger="gpufleet.remediation"):
        d = ctl.reconcile(NOW)
    assert "before-quarantine hook for gpu-0 killed after 0.5 s" in caplog.text
    assert [n for n, _ in d.quarantine] == ["gpu-0"]
    assert ("PATCH", "/api/v1/nodes/gpu-0") in [(m, p) for m, p, _ in api.calls]


def test_a_hook_that_cannot_start_does_not_stop_the_quarantine(tmp_path: Path) -> None:
    api = RecordingApi([])
    ctl = rem.Controller(api, policy(), None, before_quarantine=(str(tmp_path / "no-such-program"),))
    ctl.nodes = {"gpu-0": _sick("gpu-0")}
    assert [n for n, _ in ctl.reconcile(NOW).quarantine] == ["gpu-0"]
    assert ("PATCH", "/api/v1/nodes/gpu-0") in [(m, p) for m, p, _ in api.calls]
