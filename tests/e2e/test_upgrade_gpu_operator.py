"""End-to-end: `gpufleet upgrade run --driver gpu-operator` on the Kubernetes sandbox, where the real
NVIDIA GPU Operator's upgrade controller does each node's upgrade (ADR 0073).

A bad version stops at the canary: the operator marks it upgrade-failed, the gate fails, the canary
is rolled back and uncordoned, and every other node's driver pod is the very pod it was (same UID).
Then every node is upgraded in waves of one under the running training Job (the PodDisruptionBudget
decides when each pod may go): every driver pod runs the new version, every node is schedulable
again and the training Job has its pods Running at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import gpufleet, wait_until

from gpufleet.config.gpu_operator import UPGRADE_SKIP_LABEL, UPGRADE_STATE_LABEL
from gpufleet.core.sandbox_contract import KubeSandboxState, kube_state_path, read_kube_state
from gpufleet.fleet.upgrade.kube_driver import MAINTENANCE_ANNOTATION
from gpufleet.sandbox.kube import gpu_operator as G
from gpufleet.sandbox.kube import require_kube_paths, workload
from gpufleet.sandbox.kube.api import KubeApi
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]

STACK = "sandbox"
OLD, NEW, BAD = "550.90.07", "570.124.06", "560.0.0-bad"


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
