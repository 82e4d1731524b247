"""End-to-end: `gpufleet upgrade run --driver gpu-operator` over a pool whose first node is a kubelet
node (ADR 0081, 0082, 0083): the GPU Operator upgrades the driver pod there as a real container, and
the gate's performance pod (gpufleet's collective probe, against the reference it measured on the
node before the rollout) and smoke pod (gpufleet's one-step training run) run on the node before it
returns. A bad version fails at the canary, on the kubelet node, and is rolled back there, with the
other node untouched. A performance pod of the stack's whose figure is under the SKU's published
reference stops the rollout at the canary.

Needs root and the programs `make kube-bins` builds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import gpufleet, kube_sandbox, wait_until

from gpufleet.core.sandbox_contract import KubeSandboxState
from gpufleet.fleet.bundle.archive import read_manifest
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig
from gpufleet.sandbox.kube.gpu_operator import DRIVER_APP, NAMESPACE, driver_version
from gpufleet.sandbox.kube.kubelet_node import NODE_IMAGE

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="kubelet nodes need root (cgroups, namespaces)"),
]

STACK = "sandbox"
KUBELET, KWOK = "gpu-0", "gpu-1"  # --nodes 2: the pool's compute node (a kubelet node) and its spare
ON_KUBELET_NODE = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [KUBELET]}]}]}}}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, KubeSandboxState]]:
    with kube_sandbox(tmp_path_factory, "kubelet-upgrade-root", STACK, "--nodes", "2", "--no-training",
                      "--kubelet-nodes", "1") as (root, state, _up):
        assert state.kubelet_nodes == [KUBELET]
        yield root, state


def rollout(root: Path, tmp_path: Path, version: str, stack: str = STACK) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / f"upgrade-{version}.json"
    res = gpufleet(root, "upgrade", "run", "--stack", stack, "--driver", "gpu-operator", "--to", version,
                   "--report", str(report), timeout=300)
    return res.returncode, json.loads(report.read_text()), res.stdout + res.stderr


def driver_pods(state: KubeSandboxState) -> dict[str, dict[str, Any]]:
    assert state.admin_kubeconfig is not None
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as api:
        pods = api.list("Pod", NAMESPACE, labelSelector=f"app={DRIVER_APP}")
    return {p["spec"]["nodeName"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def gates(doc: dict[str, Any], node: str) -> list[str]:
    """The node's gate verdicts in the run's log, in order: "passed: <detail>" or "FAILED: <detail>"."""
    return [f"{e['action'].split()[1]}: {e['detail']}" for e in doc["log"]
            if e["node"] == node and e["action"].startswith("gate ")]


def phase(doc: dict[str, Any], node: str) -> str:
    """A node's end: the report lists those not done (and done ones with a reason)."""
    return next((n["phase"] for n in doc["nodes"] if n["node"] == node), "done")


def test_the_gate_runs_the_smoke_pod_on_the_kubelet_node(
    sandbox: tuple[Path, KubeSandboxState], tmp_path: Path
) -> None:
    root, state = sandbox
    rc, doc, out = rollout(root, tmp_path, "570.124.06")
    assert rc == 0, out
    assert doc["counts"] == {"done": 2}, out
    (gate,) = gates(doc, KUBELET)
    assert gate.startswith("passed: operator upgrade-done, driver 570.124.06 ready"), gate
    # The reference: the same probe on the node before the rollout (a pool of one measurable node),
    # three times; the node's figure is their median.
    runs = [float(f) for f in re.findall(
        r"gate: reference gpu/gpu-0 run [123] of 3: gloo_allreduce_busbw_gbs ([0-9.]+)", out)]
    assert len(runs) == 3, out
    median = re.search(r"gate: reference gpu/gpu-0: gloo_allreduce_busbw_gbs ([0-9.]+) \(median of 3 runs\)",
                       out)
    assert median is not None and float(median.group(1)) == pytest.approx(sorted(runs)[1], rel=1e-5), out
    assert "gate: performance floor 80% of gpu gloo_allreduce_busbw_gbs" in out
    assert re.search(r"performance gloo_allreduce_busbw_gbs [0-9.]+ = [0-9]+% \(floor 80%\)", gate), gate
    assert "smoke pod exit 0" in gate and "smoke run ok: 1 rank(s), step 1 loss" in gate
    (kwok,) = gates(doc, KWOK)
    assert kwok.startswith("passed: ") and kwok.endswith(
        "no perf pod: a kwok node runs no container; no smoke pod: a kwok node runs no container")
    assert "then the performance pod" in doc["gateNote"] and "then the smoke pod" in doc["gateNote"]
    pod = driver_pods(state)[KUBELET]
    assert driver_version(pod) == "570.124.06"
    assert pod["status"]["containerStatuses"][0]["ready"] is True  # a real container, running


def test_a_bad_version_stops_at_the_kubelet_canary_and_is_rolled_back_there(
    sandbox: tuple[Path, KubeSandboxState], tmp_path: Path
) -> None:
    root, state = sandbox
    before = driver_pods(state)
    rc, doc, out = rollout(root, tmp_path, "560.0.0-bad")
    assert rc == 1, out
    assert doc["counts"] == {"failed": 1, "skipped": 1}, out
    assert phase(doc, KUBELET) == "failed" and phase(doc, KWOK) == "skipped"
    bad, back = gates(doc, KUBELET)  # the bad version's gate, then the rolled-back version's
    assert bad.startswith("FAILED: operator state upgrade-failed"), bad
    assert "CrashLoopBackOff" in bad or "restarts" in bad
    assert back.startswith("passed: operator upgrade-done, driver 570.124.06 ready")
    assert "smoke pod exit 0" in back
    after = driver_pods(state)
    assert driver_version(after[KUBELET]) == "570.124.06"  # rolled back: a new pod at the old version
    assert after[KUBELET]["metadata"]["uid"] != before[KUBELET]["metadata"]["uid"]
    assert after[KWOK]["metadata"]["uid"] == before[KWOK]["metadata"]["uid"]  # untouched


def test_a_perf_pod_under_the_skus_published_figure_stops_the_canary(
    sandbox: tuple[Path, KubeSandboxState], tmp_path: Path
) -> None:
    """The stack's own perf pod (`inspect.perfPod`): here one reporting 200 GB/s of NCCL all_reduce,
    under the 460 GB/s AzNHC accepts for the pool's H100 SKU (thresholds.yaml). The SKU's published
    figure is the reference, whatever the pods measured; the canary fails its gate and is held."""
    root, state = sandbox
    stack = yaml.safe_load((Path("stacks") / f"Pulumi.{STACK}.yaml").read_text())
    stack["config"]["gpufleet:inspect"] = {"perfPod": {
        "image": NODE_IMAGE, "deadlineSeconds": 30, "referenceNodes": 1,
        "command": ["/bin/sh", "-c", "echo '{\"perf\": {\"nccl_allreduce_busbw_gbs\": 200}}' "
                                     "> /dev/termination-log"]}}
    stack_file = tmp_path / f"Pulumi.{STACK}.yaml"
    stack_file.write_text(yaml.safe_dump(stack))
    before = driver_pods(state)
    rc, doc, out = rollout(root, tmp_path, "575.51.03", str(stack_file))
    assert rc == 1, out
    assert "gate: performance floor 80% of gpu nccl_allreduce_busbw_gbs 460 (AzNHC" in out, out
    assert doc["counts"] == {"failed": 1, "skipped": 1}, out
    bad = gates(doc, KUBELET)[0]
    assert bad.startswith("FAILED: operator upgrade-done, driver 575.51.03 ready"), bad
    assert "GFI050 perf-collective-low: nccl_allreduce_busbw_gbs 200 = 43.5% of 460" in bad, bad
    assert driver_pods(state)[KWOK]["metadata"]["uid"] == before[KWOK]["metadata"]["uid"]  # untouched


def inspect_full(root: Path, stack: str = STACK) -> tuple[int, dict[str, dict[str, Any]], str]:
    res = gpufleet(root, "inspect", "--kubernetes", "--stack", stack, "--level", "full", "--format", "json",
                   "--no-record", timeout=300)
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {"nodes": []}
    return res.returncode, {r["node"]: r for r in doc["nodes"]}, res.stdout + res.stderr


def test_a_full_kubernetes_sweep_measures_idle_nodes_with_the_perf_pod(
    sandbox: tuple[Path, KubeSandboxState], tmp_path: Path
) -> None:
    """`gpufleet inspect --kubernetes --level full` (ADR 0083): the performance pod on each node the
    plan lets the heavy checks run on. The kubelet node is measured (gloo, against its pool's
    median: itself); the kwok node cannot run it and says so; a node a GPU job holds is not
    measured (jobs take precedence); a stack's pod under the SKU's published figure fails the node."""
    root, state = sandbox
    rc, rows, out = inspect_full(root)
    assert rc == 0 and set(rows) == {KUBELET, KWOK}, out  # nothing fails: no node publishes a reading
    gpu0 = rows[KUBELET]
    # The pool's only figure is its reference.
    assert gpu0["metrics"]["perf:gloo_allreduce_busbw_gbs:pct"] == pytest.approx(100.0), gpu0
    assert not any(u.startswith("perf:") for u in gpu0["unknown"]), gpu0
    assert "perf: a kwok node runs no container" in rows[KWOK]["unknown"], rows[KWOK]
    assert not any(k.startswith("perf:") for k in rows[KWOK]["metrics"]), rows[KWOK]
    assert state.admin_kubeconfig is not None
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as admin:
        # The sweep's pods are removed.
        assert not admin.list("Pod", "gpufleet-gameday", labelSelector="app=gpufleet-inspect-probe")
        # A job holding gpu-0's GPUs: a real container on the kubelet node.
        admin.create({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "holds-gpus", "namespace": "default"},
                      "spec": {"nodeName": KUBELET, "tolerations": [{"operator": "Exists"}],
                               "restartPolicy": "Never",
                               "containers": [{"name": "c", "image": NODE_IMAGE, "imagePullPolicy": "Never",
                                               "command": ["/bin/sleep", "120"],
                                               "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
        try:
            wait_until("the job's pod running", lambda: admin.get(
                "/api/v1/namespaces/default/pods/holds-gpus")["status"].get("phase") == "Running", 60)
            rc, rows, out = inspect_full(root)
            assert rc == 0, out
            gpu0 = rows[KUBELET]
            # allocated, or draining: the canary the test before held stays cordoned.
            assert gpu0["plan"].split(": ", 1) in (["allocated", "jobs take precedence, light checks only"],
                                                   ["draining", "jobs take precedence, light checks only"])
            assert gpu0["full"] is False, gpu0
            assert not any(k.startswith("perf:") for k in gpu0["metrics"]), gpu0
        finally:
            admin.request("DELETE", "/api/v1/namespaces/default/pods/holds-gpus?gracePeriodSeconds=0")
        wait_until("the job's pod gone", lambda: admin.request(
            "GET", "/api/v1/namespaces/default/pods/holds-gpus").status_code == 404, 60)
    stack = yaml.safe_load((Path("stacks") / f"Pulumi.{STACK}.yaml").read_text())
    stack["config"]["gpufleet:inspect"] = {"perfPod": {
        "image": NODE_IMAGE, "deadlineSeconds": 30,
        "command": ["/bin/sh", "-c", "echo '{\"perf\": {\"nccl_allreduce_busbw_gbs\": 200}}' "
                                     "> /dev/termination-log"]}}
    stack_dir = tmp_path / "stacks"
    stack_dir.mkdir()
    (stack_dir / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump(stack))
    report = tmp_path / "report"
    res = gpufleet(root, "inspect", "--kubernetes", "--stack", STACK, "--stacks-dir", str(stack_dir),
                   "--level", "full", "--format", "json", "--no-record", "--out", str(report), "--bundle",
                   timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr  # a node fails
    gpu0 = {r["node"]: r for r in json.loads(res.stdout)["nodes"]}[KUBELET]
    (finding,) = [f for f in gpu0["findings"] if f["code"] == "GFI050"]
    assert "nccl_allreduce_busbw_gbs 200 = 43.5% of 460" in finding["detail"], finding
    # The failing node's bundle, linked from its row: the cluster's view and its containers' logs.
    manifest = read_manifest(report / gpu0["bundle"]["path"])
    assert (manifest.node, manifest.source, manifest.trigger) == (KUBELET, "kubernetes", "inspect")
    assert manifest.reason is not None and manifest.reason.startswith("GFI050")
    assert manifest.member("kube-pod-logs").status == "ok"
    assert gpu0["bundle"]["path"] in (report / "inspect.html").read_text()


def test_a_job_preempts_a_sweeps_probe_with_a_negative_priority_class(
    sandbox: tuple[Path, KubeSandboxState], tmp_path: Path
) -> None:
    """Jobs take precedence over a full sweep's probe on a node in service: with the stack's
    `priorityClassName` of negative value, the real kube-scheduler preempts the probe pod for a job
    needing the node's GPUs; the sweep says so (UNKNOWN, the pod disrupted) and the job runs there."""
    root, state = sandbox
    assert state.admin_kubeconfig is not None
    stack = yaml.safe_load((Path("stacks") / f"Pulumi.{STACK}.yaml").read_text())
    stack["config"]["gpufleet:inspect"] = {"perfPod": {
        "image": NODE_IMAGE, "deadlineSeconds": 90, "priorityClassName": "gpufleet-probe-test",
        "command": ["/bin/sh", "-c", "sleep 60; echo '{\"perf\": {\"gloo_allreduce_busbw_gbs\": 1}}' "
                                     "> /dev/termination-log"]}}
    stack_dir = tmp_path / "stacks"
    stack_dir.mkdir()
    (stack_dir / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump(stack))
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as admin:
        r = admin.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "gpufleet-probe-test"}, "value": -10, "preemptionPolicy": "Never"})
        assert r.status_code == 201, r.text
        with ThreadPoolExecutor(1) as pool:
            sweep = pool.submit(gpufleet, root, "inspect", "--kubernetes", "--stack", STACK, "--stacks-dir",
                                str(stack_dir), "--level", "full", "--format", "json", "--no-record",
                                timeout=300)

            def probe_running() -> bool:
                return any(p["spec"].get("nodeName") == KUBELET and p["status"].get("phase") == "Running"
                           for p in admin.list("Pod", "gpufleet-gameday",
                                               labelSelector="app=gpufleet-inspect-probe"))

            wait_until("the sweep's probe running on the kubelet node", probe_running, 60)
            admin.create({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "job-needs-gpus", "namespace": "default"},
                          "spec": {"tolerations": [{"operator": "Exists"}], "restartPolicy": "Never",
                                   "affinity": ON_KUBELET_NODE,
                                   "containers": [{
                                       "name": "c", "image": NODE_IMAGE, "imagePullPolicy": "Never",
                                       "command": ["/bin/sleep", "120"],
                                       "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
            try:
                res = sweep.result(timeout=300)
                assert res.returncode == 0, res.stdout + res.stderr
                gpu0 = {r["node"]: r for r in json.loads(res.stdout)["nodes"]}[KUBELET]
                assert any(u.startswith("perf: perf pod disrupted (PreemptionByScheduler)")
                           for u in gpu0["unknown"]), gpu0
                job = wait_until("the job running on the kubelet node", lambda: (
                    p if (p := admin.get("/api/v1/namespaces/default/pods/job-needs-gpus"))["status"].get(
                        "phase") == "Running" else None), 90)
                assert job["spec"]["nodeName"] == KUBELET
            finally:
                admin.request("DELETE", "/api/v1/namespaces/default/pods/job-needs-gpus?gracePeriodSeconds=0")
                admin.request("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/gpufleet-probe-test")
        wait_until("the job's pod gone", lambda: admin.request(
            "GET", "/api/v1/namespaces/default/pods/job-needs-gpus").status_code == 404, 60)
