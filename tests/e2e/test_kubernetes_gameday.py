"""End-to-end: `gpufleet gameday --backend kubernetes` on the Kubernetes sandbox (real kube-apiserver,
controller manager and scheduler, kwok nodes, the platform's remediation stand-in), with the
experiments tagged `kubernetes`: a node crash (the node lifecycle controller marks the node NotReady,
the remediation fences it out of service, the pod GC and the Job controller replace its pod) and a
fatal XID (node-problem-detector's condition, quarantine, drain through the Eviction API with the
PodDisruptionBudget honoured). At 3 nodes (2 compute + 1 spare) the training Job needs both compute
nodes, so the replacement lands on the spare. Each must meet the sandbox stack's budgets; the report
is the same as the sandbox backend's.

The fault ledger is a ConfigMap in the game-day namespace, as in the CronJob (its pod's files die
with it): the game-day's faults are recorded there, and a runner killed with SIGKILL mid-fault
leaves its fault there for `gpufleet chaos revert` to undo.

Needs the programs `make kube-bins` builds; no root (state in a temporary folder, loopback only).
About 3 minutes on a quiet 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.chaos.backends.kube_ledger import ConfigMapStore
from gpufleet.chaos.backends.kubernetes import connection
from gpufleet.chaos.ledger import Ledger
from gpufleet.config import load_named_stack
from gpufleet.core.ledger_location import LEDGER_CONFIGMAP, configmap_ledger
from gpufleet.core.sandbox_contract import KubeSandboxState, kube_state_path, read_kube_state
from gpufleet.sandbox.kube import require_kube_paths
from gpufleet.sandbox.kube.api import object_path
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
EXPERIMENTS = ("k8s-node-crash", "k8s-gpu-xid79-quarantine-drain")


def test_gameday_on_the_kubernetes_backend_meets_the_budgets(tmp_path: Path) -> None:
    try:
        require_kube_paths()
    except RuntimeError as e:
        pytest.fail(str(e))  # `make test` builds them first: missing is a failure, not a skip
    root, report = tmp_path / "root", tmp_path / "report"
    namespace = load_named_stack("sandbox", REPO / "stacks").gameday.namespace
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": configmap_ledger(namespace)}
    try:
        run = subprocess.run(
            [GPUFLEET, "gameday", "--stack", "sandbox", "--backend", "kubernetes", "--nodes", "3",
             "--experiments", ",".join(EXPERIMENTS), "--report", str(report), "--keep-sandbox"],
            capture_output=True, text=True, timeout=420, env=env, cwd=REPO,
        )
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        summary = json.loads((report / "summary.json").read_text())
        assert summary["backend"] == "kubernetes" and summary["outcome"] == "PASS"
        by_name = {e["name"]: e for e in summary["experiments"]}
        assert list(by_name) == list(EXPERIMENTS)
        for e in by_name.values():
            assert e["result"] == "met", e
            assert e["measured"]["interrupted"] and e["measured"]["recovered"], e["name"]

        crash = by_name["k8s-node-crash"]["timeline"]["events"]
        detected = next(ev for ev in crash if ev["kind"] == "detected")
        assert "notready" in detected["detail"]  # the node lifecycle controller, not the chaos backend
        isolated = next(ev for ev in crash if ev["kind"] == "isolated")
        assert "notready" in isolated["detail"]  # NotReady is unschedulable (the unreachable taint follows)
        resumed = next(ev for ev in crash if ev["kind"] == "resumed")
        assert "gpu-2" in resumed["detail"]  # the spare: the job needs both compute nodes

        xid = by_name["k8s-gpu-xid79-quarantine-drain"]["timeline"]["events"]
        assert any(ev["kind"] == "detected" and "XID 79" in ev["detail"] for ev in xid)
        assert any(ev["kind"] == "isolated" and "gpufleet.io/quarantine" in ev["detail"] for ev in xid)
        assert any(ev["kind"] == "returned" for ev in xid)  # released once the condition cleared
        # The remediation's before-quarantine bundle of the XID's node, copied into the report.
        bundles = by_name["k8s-gpu-xid79-quarantine-drain"]["bundles"]
        xid_bundles = [b for b in bundles if b["reason"] == "gpu-xid-79"]
        assert len(xid_bundles) == 1, bundles
        assert (report / xid_bundles[0]["path"]).exists(), xid_bundles
        # no node publishes an inspect reading in this game-day: that member alone may be missing
        not_ok = [x for x in xid_bundles[0]["not_ok"] if not x.startswith("inspect-reading:")]
        assert not_ok == [], xid_bundles

        state = read_kube_state("sandbox", root)
        ledger = _ledger(state, namespace)
        records = ledger.records()
        assert {r.kind for r in records} == {"node-crash", "dcgm-inject"}
        assert all(r.params["node_kind"] == "simulated" for r in records)
        assert ledger.pending() == []

        _kill_9_mid_fault_then_revert(state, ledger, env, tmp_path)

        # The platform's remediation acted as its own least-privilege identity, and left its status.
        assert state.remediation_service_account == "gpufleet-system/gpufleet-remediation"
        assert state.remediation_status is not None
        status = json.loads(Path(state.remediation_status).read_text())
        assert status["mode"] == "cordon-drain-remediate" and status["quarantined"] == {}
        assert "gpufleet-remediation" in [p.name for p in state.processes]
        kubeconfig = Path(state.base_dir) / "kubeconfigs" / "remediation.kubeconfig"
        with api_from_kubeconfig(kubeconfig) as api:
            assert api.request("GET", "/api/v1/secrets").status_code == 403
            assert api.request("GET", "/api/v1/nodes").status_code == 200
    finally:
        down = subprocess.run([GPUFLEET, "sandbox", "down", "--kubernetes", "--stack", "sandbox"],
                              capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not kube_state_path("sandbox", root).exists()


def _ledger(state: KubeSandboxState, namespace: str) -> Ledger:
    """The ConfigMap ledger, read as the chaos backend's least-privilege ServiceAccount."""
    assert state.chaos_kubeconfig is not None
    return Ledger(ConfigMapStore(connection(None, state.chaos_kubeconfig, None), namespace, LEDGER_CONFIGMAP))


def _kill_9_mid_fault_then_revert(state: KubeSandboxState, ledger: Ledger, env: dict[str, str],
                                  tmp_path: Path) -> None:
    """A `chaos run` cordons a node and is SIGKILLed while it holds the fault: the ConfigMap still
    names it, and `gpufleet chaos revert` (a new process, as the next game-day pod would be) undoes it."""
    node = "gpu-1"
    exp = {
        "title": "held cordon", "description": "a fault held until the runner is killed",
        "configuration": {"gpufleet_backend": "kubernetes", "gpufleet_stack": "sandbox"},
        "controls": [{"name": "gpufleet-safety",
                      "provider": {"type": "python", "module": "gpufleet.chaos.control"}}],
        "method": [{"type": "action", "name": "cordon",
                    "provider": {"type": "python", "module": "gpufleet.chaos.node.actions",
                                 "func": "cordon_node", "arguments": {"node": node}},
                    "pauses": {"after": 300}}],
    }
    path = tmp_path / "hold.json"
    path.write_text(json.dumps(exp))
    before = {r.id for r in ledger.records()}
    runner = subprocess.Popen(
        [str(Path(sys.executable).parent / "chaos"), "--log-file", str(tmp_path / "hold.log"), "run",
         "--journal-path", str(tmp_path / "hold.journal.json"), str(path)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not [r for r in ledger.pending() if r.id not in before]:
            time.sleep(0.5)
        time.sleep(2)  # recorded before applied: let the cordon itself land
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
    (held,) = ledger.pending()
    assert (held.kind, held.target["node"]) == ("cordon", node)
    admin = state.admin_kubeconfig
    assert admin is not None
    with api_from_kubeconfig(Path(admin)) as api:
        assert api.get(object_path("Node", node))["spec"].get("unschedulable") is True
        rev = subprocess.run([GPUFLEET, "chaos", "revert", "--stack", "sandbox"],
                             capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        assert rev.returncode == 0, rev.stdout + rev.stderr
        assert "reverted" in rev.stdout and held.id in rev.stdout
        assert not api.get(object_path("Node", node))["spec"].get("unschedulable")
    assert ledger.pending() == []
