"""End-to-end: `gpufleet upgrade run --driver gpu-operator` on the Kubernetes sandbox, where the real
NVIDIA GPU Operator's upgrade controller does each node's upgrade (ADR 0073).

A bad version stops at the canary: the operator marks it upgrade-failed, the gate fails, the canary
is rolled back and uncordoned, and every other node's driver pod is the very pod it was (same UID).
Then every node is upgraded in waves of one under the running training Job (the PodDisruptionBudget
decides when each pod may go): every driver pod runs the new version, every node is schedulable
again and the training Job has its pods Running at the end.

Then one actor (issue 16): a fatal XID injected by the chaos extension's own action (the catalog's
`gpu-xid-79`, node-problem-detector's condition on this backend) on the node the rollout holds is
handled by the rollout alone: its gate fails on the fault, it rolls the node back, halts and holds the
node; the platform's remediation (the sandbox's stand-in for NVSentinel) sees the fault, logs that it
stood aside and never quarantines the node. The same fault on a node no rollout holds is quarantined
by remediation alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import GPUFLEET, REPO, gpufleet, wait_until

from gpufleet.config.gpu_operator import UPGRADE_SKIP_LABEL, UPGRADE_STATE_LABEL
from gpufleet.core.maintenance import under_upgrade
from gpufleet.core.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from gpufleet.core.sandbox_contract import KubeSandboxState, kube_state_path, read_kube_state
from gpufleet.fleet.upgrade.kube_driver import MAINTENANCE_ANNOTATION
from gpufleet.sandbox.kube import gpu_operator as G
from gpufleet.sandbox.kube import require_kube_paths, workload
from gpufleet.sandbox.kube.api import KubeApi
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]

STACK = "sandbox"
OLD, NEW, BAD = "550.90.07", "570.124.06", "560.0.0-bad"
NEXT = "575.51.03"  # the one-actor test's rollout, after NEW
CHAOS = {"gpufleet_backend": "kubernetes", "gpufleet_stack": STACK}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, KubeSandboxState]]:
    try:
        require_kube_paths()
    except RuntimeError as e:
        pytest.fail(str(e))  # `make test` builds them first: missing is a failure, not a skip
    root = tmp_path_factory.mktemp("gpu-operator-root")
    res = gpufleet(root, "sandbox", "up", "--kubernetes", "--stack", STACK, "--timeout", "240")
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        assert "GPU Operator gpu-operator/gpu-operator" in res.stdout
        yield root, read_kube_state(STACK, root)
    finally:
        if kube_state_path(STACK, root).exists():
            down = gpufleet(root, "sandbox", "down", "--kubernetes", "--stack", STACK)
            assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def admin(sandbox: tuple[Path, KubeSandboxState]) -> Iterator[KubeApi]:
    assert sandbox[1].admin_kubeconfig is not None
    with api_from_kubeconfig(Path(sandbox[1].admin_kubeconfig)) as api:
        yield api


def driver_pods(api: KubeApi) -> dict[str, dict[str, Any]]:
    pods = api.list("Pod", G.NAMESPACE, labelSelector=f"app={G.DRIVER_APP}")
    return {p["spec"]["nodeName"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def gpu_nodes(api: KubeApi) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in api.list("Node") if n["metadata"]["name"] in driver_pods(api)}


def upgrade(root: Path, tmp: Path, version: str) -> tuple[int, dict[str, Any], str]:
    report = tmp / f"upgrade-{version}.json"
    res = gpufleet(root, "upgrade", "run", "--stack", STACK, "--driver", "gpu-operator", "--to", version,
                   "--report", str(report), timeout=600)
    assert report.exists(), res.stdout + res.stderr
    return res.returncode, json.loads(report.read_text()), res.stdout


def test_a_bad_version_stops_at_the_canary(sandbox: tuple[Path, KubeSandboxState], admin: KubeApi,
                                           tmp_path: Path) -> None:
    root, _ = sandbox
    before = driver_pods(admin)
    assert {n: G.driver_version(p) for n, p in before.items()} == dict.fromkeys(before, OLD)
    rc, doc, out = upgrade(root, tmp_path, BAD)
    assert rc == 1, out
    assert doc["counts"] == {"failed": 1, "skipped": len(before) - 1}, out
    canary = next(e["node"] for e in doc["log"] if e["action"] == "cordon")
    gate = next(e for e in doc["log"] if e["action"] == "gate FAILED")
    assert "upgrade-failed" in gate["detail"] and "CrashLoopBackOff" in gate["detail"], gate
    after = driver_pods(admin)
    # The canary was rolled back: a new pod at the old version, ready; the others were never touched.
    assert G.driver_version(after[canary]) == OLD
    assert after[canary]["metadata"]["uid"] != before[canary]["metadata"]["uid"]
    for n, p in after.items():
        if n != canary:
            assert p["metadata"]["uid"] == before[n]["metadata"]["uid"], n
    nodes = gpu_nodes(admin)
    assert not any(n["spec"].get("unschedulable") for n in nodes.values())
    assert not any(MAINTENANCE_ANNOTATION in (n["metadata"].get("annotations") or {}) for n in nodes.values())
    # Handed back to gpufleet: the operator leaves every node alone between rollouts.
    assert {n["metadata"]["labels"].get(UPGRADE_SKIP_LABEL) for n in nodes.values()} == {"true"}
    assert nodes[canary]["metadata"]["labels"][UPGRADE_STATE_LABEL] == "upgrade-done"
    # The operator marked the others upgrade-required while the bad image was in the template; they
    # run the template's version again, and the hand back cleared that stale mark.
    states = {n: x["metadata"]["labels"].get(UPGRADE_STATE_LABEL) for n, x in nodes.items() if n != canary}
    assert "upgrade-required" not in states.values(), states
    assert "cleared the operator's stale upgrade-required" in out, out


def test_every_node_under_the_training_job(sandbox: tuple[Path, KubeSandboxState], admin: KubeApi,
                                           tmp_path: Path) -> None:
    root, _ = sandbox
    rc, doc, out = upgrade(root, tmp_path, NEW)
    assert rc == 0, out
    assert doc["counts"] == {"done": len(driver_pods(admin))}, out
    pods = driver_pods(admin)
    assert {n: G.driver_version(p) for n, p in pods.items()} == dict.fromkeys(pods, NEW)
    nodes = gpu_nodes(admin)
    assert not any(n["spec"].get("unschedulable") for n in nodes.values())
    assert {n["metadata"]["labels"][UPGRADE_STATE_LABEL] for n in nodes.values()} == {"upgrade-done"}
    evicted = [e for e in doc["log"] if e["action"] == "evict"]
    assert evicted, "the training Job's pods were on the nodes: the rollout evicted them"
    print("capacity:", doc["capacity"], "evictions:", len(evicted))

    def training_running() -> bool:
        pods = admin.list("Pod", workload.TRAINING_NAMESPACE, labelSelector=f"job-name={workload.JOB_NAME}")
        running = [p for p in pods if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        return len(running) == 2

    wait_until("the training Job's 2 pods Running", training_running, 60)


def remediation_lines(state: KubeSandboxState, node: str, what: str) -> list[str]:
    log = Path(state.base_dir) / "logs" / "gpufleet-remediation.log"
    return [ln for ln in log.read_text().splitlines() if f"{node}: gpu-xid-79" in ln and what in ln]


def quarantined(node: dict[str, Any]) -> bool:
    taints = {t.get("key") for t in node["spec"].get("taints") or []}
    return QUARANTINE_TAINT in taints or QUARANTINE_ANNOTATION in (node["metadata"].get("annotations") or {})


def test_a_gpu_fault_on_the_node_under_upgrade_is_handled_by_the_rollout_alone(
        sandbox: tuple[Path, KubeSandboxState], admin: KubeApi, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.chaos.gpu.actions import clear_gpu_faults, inject_gpu_fault

    root, state = sandbox
    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("GPUFLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    report = tmp_path / "rollout.json"
    # The fault must land within the node's upgrade (about 2 s here): a dry run first loads the
    # catalog, the stack and the Kubernetes client, so that the real injection is only its writes.
    inject_gpu_fault("gpu-xid-79", "gpu-1", gpu=3, configuration={**CHAOS, "gpufleet_dry_run": True})
    argv = [GPUFLEET, "upgrade", "run", "--stack", STACK, "--driver", "gpu-operator", "--to", NEXT,
            "--report", str(report)]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def taken() -> str | None:
            # The rollout cordons and marks a node in one patch, before it hands the node to the
            # operator: the fault lands on a node the rollout holds, before its reboot and gate.
            for n in admin.list("Node"):
                if under_upgrade((n["metadata"].get("annotations") or {}).get(MAINTENANCE_ANNOTATION)):
                    return str(n["metadata"]["name"])
            return None

        node = wait_until("a node taken by the rollout", taken, 300, 0.05)
        t0 = time.monotonic()
        print("injected:", inject_gpu_fault("gpu-xid-79", node, gpu=3, configuration=CHAOS),
              f"{time.monotonic() - t0:.2f} s after the mark was seen")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(out)
    # The rollout handled it: the gate failed on the fault, the node was rolled back and, its gate
    # failing again on the same fault, held for people; the rollout halted at the canary.
    assert proc.returncode == 1, out
    doc = json.loads(report.read_text())
    gates = [e for e in doc["log"] if e["node"] == node and e["action"].startswith("gate")]
    assert gates and all(e["action"] == "gate FAILED" for e in gates), gates
    assert all("GpuFleetProblem" in e["detail"] and "79" in e["detail"] for e in gates), gates
    assert [e["action"] for e in doc["log"] if e["node"] == node].count("reboot") == 2  # up, then back
    assert doc["haltedBy"] and node in doc["haltedBy"]
    assert [e["node"] for e in doc["log"] if e["action"] == "cordon"] == [node]  # halted at the canary
    held = admin.get(f"/api/v1/nodes/{node}")
    assert held["spec"].get("unschedulable") is True
    assert held["metadata"]["annotations"][MAINTENANCE_ANNOTATION].startswith("gpufleet-upgrade-failed: ")
    assert G.driver_version(driver_pods(admin)[node]) == NEW  # rolled back to what it ran
    # Remediation saw the fault (it reconciles at every node change) and stood aside, every round.
    wait_until("remediation logs that it stood aside",
               lambda: remediation_lines(state, node, "stood aside"), 60)
    time.sleep(5)  # more rounds (at least one a second): none may quarantine the node
    assert not quarantined(admin.get(f"/api/v1/nodes/{node}"))
    assert not remediation_lines(state, node, "quarantined")
    status = json.loads(Path(state.remediation_status or "").read_text())
    assert node not in status["quarantined"], status

    # The same fault on a node no rollout holds: remediation quarantines it, alone. First the chaos
    # rollback clears the fault, and the held node is returned as a person would (uncordon, drop the
    # mark), so that the blast-radius guard counts no node out.
    print(clear_gpu_faults(node=node, configuration=CHAOS))
    back = admin.request("PATCH", f"/api/v1/nodes/{node}", {
        "spec": {"unschedulable": False}, "metadata": {"annotations": {MAINTENANCE_ANNOTATION: None}}},
        content_type="application/merge-patch+json")
    assert back.status_code == 200, back.text
    other = sorted(n for n in driver_pods(admin) if n != node)[-1]
    inject_gpu_fault("gpu-xid-79", other, gpu=3, configuration=CHAOS)
    try:
        wait_until("remediation quarantines the node",
                   lambda: quarantined(admin.get(f"/api/v1/nodes/{other}")), 60)
        node_now = admin.get(f"/api/v1/nodes/{other}")
        assert MAINTENANCE_ANNOTATION not in (node_now["metadata"].get("annotations") or {})
        assert remediation_lines(state, other, "quarantined")
        assert not remediation_lines(state, other, "stood aside")
    finally:
        print(clear_gpu_faults(configuration=CHAOS))
    wait_until("remediation releases the node",
               lambda: not quarantined(admin.get(f"/api/v1/nodes/{other}")), 60)
