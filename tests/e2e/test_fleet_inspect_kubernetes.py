"""End-to-end: a Kubernetes fleet sweep on the Kubernetes sandbox (real kube-apiserver, kwok nodes).

Each node inspects itself with `gpufleet inspect --here --publish` (as node-problem-detector or a
DaemonSet would run it there), which writes its observation to a ConfigMap in gpufleet-inspect; then
`gpufleet inspect --kubernetes` judges every node of the stack from the cluster: the published
readings, the stack's pools, and the scheduler's view from the Node and its GPU pods.

kwok nodes have no GPUs and run no processes, so the `--here` runs happen in this test's process
with an `nvidia-smi` test double on PATH (8 H100s; one node with 2 uncorrectable ECC errors on GPU
5) and a kernel log file: what is real is the publishing, the API server, the sweep, its history and
its report. This host has no InfiniBand HCAs, so every published node also reports its fabric rail
missing; the assertions name the ECC finding and the unknown nodes, not a clean pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import gpufleet, kube_sandbox, nvidia_smi_double, wait_until

from gpufleet.core.inspect_contract import (
    DATA_KEY,
    INSPECT_NAMESPACE,
    NODE_LABEL,
    PUBLISHED_BY_ANNOTATION,
    PUBLISHER_NAMESPACE,
    PUBLISHER_SERVICE_ACCOUNT,
    configmap_name,
)
from gpufleet.core.sandbox_contract import KubeSandboxState
from gpufleet.sandbox.kube.api import KubeApi
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig
from gpufleet.sandbox.kube.kubeconfig import kubeconfig, write_kubeconfig

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

STACK = "sandbox"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, KubeSandboxState]]:
    with kube_sandbox(tmp_path_factory, "inspect-kube-root", STACK, "--no-gpu-operator",
                      "--timeout", "240") as (root, state, _):
        yield root, state


def test_nodes_publish_and_one_sweep_judges_the_cluster(sandbox: tuple[Path, KubeSandboxState],
                                                        tmp_path: Path) -> None:
    root, state = sandbox
    assert state.admin_kubeconfig is not None
    # Each node's writer: a token bound to the Node, for its own ConfigMap in gpufleet-inspect only.
    writers = state.inspect_kubeconfigs
    assert sorted(writers) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"], writers
    path = nvidia_smi_double(tmp_path / "bin")
    klog = tmp_path / "kern.log"
    klog.write_text("2026-12-06T00:00:00+00:00 gpu kernel: nothing from NVRM\n")

    def publish(node: str, bad_gpu: str = "") -> str:
        res = gpufleet(root, "inspect", "--here", "--stack", STACK, "--node", node, "--kernel-log", str(klog),
                       "--publish", "--kubeconfig", writers[node], "--no-record", "--format", "npd",
                       env_extra={"PATH": path, "SMI_BAD_GPU": bad_gpu})
        assert res.returncode in (0, 1), res.stdout + res.stderr
        assert f"published {INSPECT_NAMESPACE}/{configmap_name(node)}" in res.stderr, res.stderr
        return res.stdout.strip()

    # gpu-3 and gpu-4 never publish.
    assert "ecc" not in publish("gpu-0")
    assert "ecc" not in publish("gpu-1")
    assert publish("gpu-2", bad_gpu="5").startswith("PROBLEM: GFI013 ecc-uncorrectable GPU 5")
    with api_from_kubeconfig(Path(writers["gpu-0"])) as writer:
        # Least privilege: the writer reads no node, no ConfigMap, and writes nothing outside its namespace.
        assert writer.request("GET", "/api/v1/nodes").status_code == 403
        assert writer.request("GET", f"/api/v1/namespaces/{INSPECT_NAMESPACE}/configmaps").status_code == 403
        assert writer.request("PATCH", "/api/v1/nodes/gpu-0", {"spec": {"unschedulable": True}},
                              content_type="application/merge-patch+json").status_code == 403
        stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
        refused = writer.request("POST", "/api/v1/namespaces/gpufleet-system/configmaps", stray)
        assert refused.status_code == 403
        # ... and in its namespace only its own node's ConfigMap, labelled with its node, naming no
        # pod it is not (ADR 0077: the real API server's admission policy, from the token's node).
        for name, node, writer_pod, why in (
                ("inspect-gpu-1", "gpu-1", None, "node gpu-0 may write only ConfigMap inspect-gpu-0"),
                ("inspect-gpu-0", "gpu-1", None, "must label its ConfigMap gpufleet.io/inspect-node=gpu-0"),
                ("inspect-gpu-0", "gpu-0", "inspect-xyz", "must name the pod the token is bound to (none)")):
            forged = _configmap(name, node, writer_pod)
            r = writer.request("POST", f"/api/v1/namespaces/{INSPECT_NAMESPACE}/configmaps", forged)
            assert r.status_code == 403 and why in r.text, (name, r.status_code, r.text)
            # gpu-0 and gpu-1 have published: an update is refused as a create is.
            r = writer.request("PUT", f"/api/v1/namespaces/{INSPECT_NAMESPACE}/configmaps/{name}", forged)
            assert r.status_code == 403 and why in r.text, (name, r.status_code, r.text)
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as admin:
        # The writer's token bound to nothing names no node: refused whatever it writes.
        unbound, _ = admin.token(PUBLISHER_NAMESPACE, PUBLISHER_SERVICE_ACCOUNT, 600)
        assert state.api_url is not None and state.ca_file is not None
        path = write_kubeconfig(tmp_path / "unbound.kubeconfig", kubeconfig(
            state.api_url, Path(state.ca_file), PUBLISHER_SERVICE_ACCOUNT, token=unbound))
        with api_from_kubeconfig(path) as writer:
            r = writer.request("POST", f"/api/v1/namespaces/{INSPECT_NAMESPACE}/configmaps",
                               _configmap("inspect-gpu-3", "gpu-3", None))
            assert r.status_code == 403 and "bound to no node" in r.text, r.text
        cm = admin.get(f"/api/v1/namespaces/{INSPECT_NAMESPACE}/configmaps/{configmap_name('gpu-2')}")
        published = json.loads(cm["data"][DATA_KEY])
        assert published["node"] == "gpu-2" and len(published["gpus"]) == 8
        _cordon(admin, "gpu-1")
        # Three jobs keep off gpu-0 the Kubernetes way (required node affinity, hostname NotIn): a
        # Job of 2 pods, a Job of 1 and a bare pod. The controller manager makes the Jobs' pods.
        for name, pods in (("avoid-a", 2), ("avoid-b", 1)):
            admin.create(_avoiding_job(name, "gpu-0", pods))
        admin.create({"apiVersion": "v1", "kind": "Pod", "spec": _avoiding_pod_spec("gpu-0"),
                      "metadata": {"name": "avoid-c", "namespace": "default"}})
        wait_until("the avoiding jobs' 4 pods", lambda: sum(
            1 for p in admin.list("Pod", "default") if p["metadata"]["name"].startswith("avoid-")) == 4, 60)
        busy = any(p["spec"].get("nodeName") == "gpu-1" and p["status"].get("phase") == "Running"
                   for p in admin.list("Pod"))  # the training Job's pods are the only pods on kwok nodes

    history = tmp_path / "history"
    out = tmp_path / "report"
    res = gpufleet(root, "inspect", "--kubernetes", "--stack", STACK, "--history", str(history),
                   "--out", str(out), "--format", "json")
    assert res.returncode == 1, res.stdout + res.stderr  # a node fails
    doc = json.loads((out / "inspect.json").read_text())
    rows = {n["node"]: n for n in doc["nodes"]}
    assert sorted(rows) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    codes = {n: {(f["name"], f["subject"]) for f in r["findings"]} for n, r in rows.items()}
    assert ("ecc-uncorrectable", "GPU 5") in codes["gpu-2"]
    assert not any(name.startswith(("ecc", "gpu")) for name, _ in codes["gpu-0"] | codes["gpu-1"])
    for n in ("gpu-3", "gpu-4"):
        assert rows[n]["status"] == "unknown" and rows[n]["findings"] == []
        assert rows[n]["unknown"][0].startswith("no inspect result published by the node"), rows[n]
    # The history holds the cluster's view of each node: gpu-1, cordoned, is draining while a
    # training pod still runs there, else drained.
    records = [json.loads(line) for line in (history / f"{STACK}.jsonl").read_text().splitlines()]
    sched = {r["node"]: r["observation"]["sched_state"] for r in records}
    assert sched["gpu-1"] == ("draining" if busy else "drained"), sched
    assert {sched[n] for n in ("gpu-0", "gpu-2", "gpu-3", "gpu-4")} <= {"idle", "mixed", "allocated"}, sched
    assert (out / "inspect.html").exists() and (out / "inspect.junit.xml").exists()
    # The jobs that kept off gpu-0: counted once each (not per pod), and more than the lemon rule's 2.
    assert rows["gpu-0"]["metrics"]["job_exclusions"] == 3, rows["gpu-0"]["metrics"]
    lemon = rows["gpu-0"]["lemon"]
    assert lemon["exclusions"] == 3 and "excluded by 3 jobs" in lemon["reason"], lemon
    assert doc["lemons"] == ["gpu-0"]
    assert all(rows[n]["metrics"]["job_exclusions"] == 0 for n in rows if n != "gpu-0")

    # node-problem-detector's contract from the cluster's view: one node, its code and line.
    npd = gpufleet(root, "inspect", "--kubernetes", "--stack", STACK, "--node", "gpu-2", "--format", "npd",
                   "--no-record")
    assert (npd.returncode, npd.stdout.split(" (")[0].strip()) == (
        1, "PROBLEM: GFI013 ecc-uncorrectable GPU 5"), npd.stdout + npd.stderr

    # Old readings are not judged as today's.
    time.sleep(2)
    stale = gpufleet(root, "inspect", "--kubernetes", "--stack", STACK, "--max-age", "1", "--format", "json",
                     "--no-record")
    assert stale.returncode == 0, stale.stdout + stale.stderr  # nothing fails: nothing is judged
    for r in json.loads(stale.stdout)["nodes"]:
        assert r["status"] == "unknown", r
        if r["node"] in ("gpu-0", "gpu-1", "gpu-2"):
            assert "older than 1 s" in r["unknown"][0], r


def _configmap(name: str, node: str, writer_pod: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": INSPECT_NAMESPACE, "labels": {NODE_LABEL: node}}
    if writer_pod:
        meta["annotations"] = {PUBLISHED_BY_ANNOTATION: writer_pod}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {DATA_KEY: "{}"}}


def _avoiding_pod_spec(node: str) -> dict[str, Any]:
    return {"restartPolicy": "Never",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}]}]}}},
            "containers": [{"name": "c", "image": "busybox"}]}


def _avoiding_job(name: str, node: str, pods: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"spec": _avoiding_pod_spec(node)}}}


def _cordon(admin: KubeApi, node: str) -> None:
    r = admin.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}},
                      content_type="application/merge-patch+json")
    assert r.status_code == 200, r.text
