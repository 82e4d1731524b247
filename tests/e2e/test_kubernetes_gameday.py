"""End-to-end: `gpufleet gameday --backend kubernetes` on the Kubernetes sandbox (real kube-apiserver,
controller manager and scheduler, kwok nodes, the platform's remediation stand-in), with the
experiments tagged `kubernetes`: a node crash (the node lifecycle controller marks the node NotReady,
the remediation fences it out of service, the pod GC and the Job controller replace its pod) and a
fatal XID (node-problem-detector's condition, quarantine, drain through the Eviction API with the
PodDisruptionBudget honoured). At 3 nodes (2 compute + 1 spare) the training Job needs both compute
nodes, so the replacement lands on the spare. Each must meet the sandbox stack's budgets; the report
is the same as the sandbox backend's.

Needs the programs `make kube-bins` builds; no root (state in a temporary folder, loopback only).
About 2.5 minutes on a quiet 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.chaos.ledger import Ledger
from gpufleet.core.sandbox_contract import kube_state_path, read_kube_state
from gpufleet.sandbox.kube import require_kube_paths
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
    root, report, ledger = tmp_path / "root", tmp_path / "report", tmp_path / "faults.jsonl"
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(ledger)}
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

        records = Ledger(ledger).records()
        assert {r.kind for r in records} == {"node-crash", "dcgm-inject"}
        assert all(r.params["node_kind"] == "simulated" for r in records)
        assert Ledger(ledger).pending() == []

        # The platform's remediation acted as its own least-privilege identity, and left its status.
        state = read_kube_state("sandbox", root)
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
