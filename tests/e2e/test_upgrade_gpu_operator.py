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

Last, the gate's inspect step (ADR 0075): with the stack's inspect publisher DaemonSet on the
cluster, each node's gate restarts the node's publisher pod and judges its first reading; a node the
operator's validation passes but whose NVML still reports the old driver fails its gate on the drift.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import GPUFLEET, REPO, gpufleet, kube_sandbox, nvidia_smi_double, wait_until

from gpufleet.config.gpu_operator import UPGRADE_SKIP_LABEL, UPGRADE_STATE_LABEL
from gpufleet.core.inspect_contract import (
    INSPECT_NAMESPACE,
    PUBLISHER_APP_LABEL,
    PUBLISHER_NAMESPACE,
    PUBLISHER_SERVICE_ACCOUNT,
)
from gpufleet.core.maintenance import under_upgrade
from gpufleet.core.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from gpufleet.core.sandbox_contract import KubeSandboxState
from gpufleet.fleet.upgrade.kube_driver import MAINTENANCE_ANNOTATION, PUBLISHER_SELECTOR
from gpufleet.sandbox.kube import gpu_operator as G
from gpufleet.sandbox.kube import workload
from gpufleet.sandbox.kube.api import KubeApi
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]

STACK = "sandbox"
OLD, NEW, BAD = "550.90.07", "570.124.06", "560.0.0-bad"
NEXT = "575.51.03"  # the one-actor test's rollout, after NEW
FINAL = "575.57.08"  # the inspect gate's rollout, after the one-actor test
CHAOS = {"gpufleet_backend": "kubernetes", "gpufleet_stack": STACK}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, KubeSandboxState]]:
    with kube_sandbox(tmp_path_factory, "gpu-operator-root", STACK, "--timeout", "240") as (root, state, up):
        assert "GPU Operator gpu-operator/gpu-operator" in up.stdout
        yield root, state


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
        # Before the quarantine, remediation's hook collected the node's bundle from the API server:
        # the node as the fault left it (its condition True, no quarantine yet), its pods. The node
        # the rollout handled has none: remediation never acted on it.
        bundles = _bundles(Path(state.base_dir) / "bundles")
        assert node not in bundles, bundles
        manifest, taints, condition = bundles[other]
        assert (manifest.trigger, manifest.reason, manifest.source) == (
            "remediation", "gpu-xid-79", "kubernetes")
        assert {m.collector: m.status for m in manifest.members if m.collector != "inspect-reading"} == {
            "kube-node": "ok", "kube-node-events": "ok", "kube-pods": "ok",
            "kube-pod-logs": "ok"}, manifest.members
        reading = manifest.member("inspect-reading")  # no publisher runs in this test: not found, said so
        assert reading.status == "ok" or "HTTP 404" in (reading.error or ""), reading
        assert QUARANTINE_TAINT not in taints and condition == "True", (taints, condition)
    finally:
        print(clear_gpu_faults(configuration=CHAOS))
    wait_until("remediation releases the node",
               lambda: not quarantined(admin.get(f"/api/v1/nodes/{other}")), 60)


# ----------------------------------------------------------------------------- the gate's inspect step

LAGS = "580.65.06"  # a version whose kernel module never loads: NVML keeps reporting the one before


class PublisherStandIn(threading.Thread):
    """Plays the inspect publisher's container on the kwok nodes (they run none): for each new
    publisher pod, what the DaemonSet's container does first (`gpufleet inspect --here --publish`'s
    read and publish, in this process): the node read through an nvidia-smi test double reporting the
    driver version NVML would (the node's driver pod's, except LAGS), a sysfs tree with the stack's
    one 100 Gb/s RoCE port up and a kernel log without NVRM lines. It publishes with a token bound to
    the pod, as the kubelet mounts one in the pod's container (the admission policy of ADR 0077 then
    takes its node and name from it). The publishing (the writer's token, the ConfigMap), the gate's
    restart of the pod and its reading of it are real."""

    def __init__(self, admin: KubeApi, state: KubeSandboxState, tmp: Path) -> None:
        super().__init__(daemon=True)
        from gpufleet.config import load_named_stack

        self.admin, self.state, self.tmp = admin, state, tmp
        self.spec = load_named_stack(STACK, REPO / "stacks")
        self.driver_file = tmp / "nvml-driver"
        self.klog = tmp / "kern.log"
        self.klog.write_text("2026-12-06T00:00:00+00:00 gpu kernel: nothing from NVRM\n")
        self.net = tmp / "net"
        port = self.net / "fab0"
        port.mkdir(parents=True)
        for f, v in {"operstate": "up", "speed": "100000", "carrier_changes": "1"}.items():
            (port / f).write_text(v + "\n")
        self.seen: set[str] = set()
        self.nvml: dict[str, str] = {}  # node -> the version its NVML last reported
        self.published: list[tuple[str, str]] = []  # (node, version reported)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                for pod in self.admin.list("Pod", PUBLISHER_NAMESPACE, labelSelector=PUBLISHER_SELECTOR):
                    uid, node = pod["metadata"]["uid"], pod["spec"].get("nodeName")
                    if uid in self.seen or not node or pod["metadata"].get("deletionTimestamp") \
                            or pod["status"].get("phase") != "Running":
                        continue
                    self.publish(node, pod)
                    self.seen.add(uid)
        except BaseException as e:  # reported by the test
            self.error = e

    def client(self, pod: dict[str, Any]) -> Any:
        """The pod's writer: a token bound to it (what the kubelet mounts), in a kubeconfig."""
        from gpufleet.core.kube_client import kube_client
        from gpufleet.sandbox.kube.kubeconfig import kubeconfig, write_kubeconfig

        assert self.state.api_url is not None and self.state.ca_file is not None
        token, _ = self.admin.token(PUBLISHER_NAMESPACE, PUBLISHER_SERVICE_ACCOUNT, 3600,
                                    bound_to={**pod, "kind": "Pod", "apiVersion": "v1"})
        path = write_kubeconfig(self.tmp / "writers" / f"{pod['metadata']['name']}.kubeconfig", kubeconfig(
            self.state.api_url, Path(self.state.ca_file), PUBLISHER_SERVICE_ACCOUNT, token=token,
            namespace=INSPECT_NAMESPACE))
        return kube_client(path)

    def publish(self, node: str, pod: dict[str, Any]) -> None:
        from gpufleet.fleet.inspect.cluster import publish
        from gpufleet.fleet.inspect.host import HostTarget, observation_from_host, read_host

        pod_version = G.driver_version(driver_pods(self.admin)[node]) or ""
        version = self.nvml.get(node, OLD) if pod_version == LAGS else pod_version
        self.nvml[node] = version
        self.driver_file.write_text(version + "\n")
        pool = self.spec.node_pools[0]
        target = HostTarget(node=node, pool=pool.name, sku=pool.accelerator, expected_gpus=pool.gpus_per_node,
                            expected_port_gbps=float(self.spec.fabric.link_speed_gbps),
                            rails=self.spec.fabric.rails_per_node)
        now = time.time()
        reads = read_host(target, now=now, kernel_log=self.klog, fabric_ifs=("fab0",), net_root=self.net)
        publish(self.client(pod), observation_from_host(reads, target, at=now), INSPECT_NAMESPACE,
                pod["metadata"]["name"])
        self.published.append((node, version))


def _bundles(folder: Path) -> dict[str, tuple[Any, list[str], str | None]]:
    """node -> (manifest, the Node's taint keys, its GpuFleetProblem status) of each bundle, verified."""
    import tarfile

    from gpufleet.core.node_health import CONDITION
    from gpufleet.fleet.bundle.archive import verify

    out = {}
    for path in sorted(folder.glob("*.tar.gz")) if folder.exists() else []:
        manifest, problems = verify(path)
        assert not problems, (path, problems)
        with tarfile.open(path) as tar:
            f = tar.extractfile("kube/node.json")
            assert f is not None
            node = json.loads(f.read())
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        cond = next((c["status"] for c in node["status"].get("conditions") or []
                     if c["type"] == CONDITION), None)
        out[manifest.node] = (manifest, taints, cond)
    return out


def _publisher_daemonset() -> tuple[str, dict[str, Any]]:
    """The Pulumi program's DaemonSet for the stack's pool, from infra.fleet_inspect, built in a child
    process: the infra layer imports Pulumi's SDK and with it gRPC's runtime (its own threads and fork
    handlers), which the one pytest process of the whole e2e tier is better off without."""
    code = f"""
import json
from gpufleet.config import load_named_stack
from gpufleet.infra.fleet_inspect import RUNTIME_CLASS, daemonset_name, daemonset_spec
pool = load_named_stack({STACK!r}, "stacks").node_pools[0]
spec = daemonset_spec(pool, {STACK!r}, "gpufleet:e2e", [{{"operator": "Exists"}}])
print(json.dumps([RUNTIME_CLASS, daemonset_name(pool), spec]))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    runtime_class, name, spec = json.loads(res.stdout)
    key, app = PUBLISHER_APP_LABEL
    return runtime_class, {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {
        "name": name, "namespace": PUBLISHER_NAMESPACE, "labels": {key: app}}, "spec": spec}


@pytest.fixture
def publishers(sandbox: tuple[Path, KubeSandboxState], admin: KubeApi, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[PublisherStandIn]:
    """The Pulumi program's publisher DaemonSet for the stack's pool (infra.fleet_inspect), the
    `nvidia` RuntimeClass its pods name (the GPU Operator's, created here if the sandbox's operator
    has not), and the stand-in for its containers."""
    monkeypatch.setenv("PATH", nvidia_smi_double(tmp_path / "bin"))
    stand_in = PublisherStandIn(admin, sandbox[1], tmp_path)
    monkeypatch.setenv("SMI_DRIVER_FILE", str(stand_in.driver_file))
    runtime_class, ds = _publisher_daemonset()
    if admin.request("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime_class}").status_code == 404:
        rc = admin.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class},
            "handler": runtime_class})
        assert rc.status_code == 201, rc.text
    made = admin.request("POST", f"/apis/apps/v1/namespaces/{PUBLISHER_NAMESPACE}/daemonsets", ds)
    assert made.status_code == 201, made.text
    gone = f"/apis/apps/v1/namespaces/{PUBLISHER_NAMESPACE}/daemonsets/{ds['metadata']['name']}"
    stand_in.start()
    try:
        nodes = set(driver_pods(admin))
        wait_until("every GPU node's first reading",
                   lambda: {n for n, _ in stand_in.published} >= nodes or stand_in.error, 120)
        assert stand_in.error is None, stand_in.error
        yield stand_in
    finally:
        stand_in.stop.set()
        stand_in.join(10)
        admin.request("DELETE", gone)
    assert stand_in.error is None, stand_in.error


def test_the_gate_reads_each_node_s_own_inspection_through_its_new_driver(
        sandbox: tuple[Path, KubeSandboxState], admin: KubeApi, publishers: PublisherStandIn,
        tmp_path: Path) -> None:
    root, _ = sandbox
    # Without the training Job: the evictions under it are the second test's. Here every eviction
    # would count against its backoff (exponential, from 10 s), and its next pod, and so the
    # PodDisruptionBudget's leave for the next node's drain, can come after the drain timeout.
    job = f"/apis/batch/v1/namespaces/{workload.TRAINING_NAMESPACE}/jobs/{workload.JOB_NAME}"
    gone = admin.request("DELETE", job + "?propagationPolicy=Foreground")
    assert gone.status_code in (200, 202, 404), gone.text
    wait_until("the training Job's pods gone", lambda: not admin.list(
        "Pod", workload.TRAINING_NAMESPACE, labelSelector=f"job-name={workload.JOB_NAME}"), 60)
    before = driver_pods(admin)
    # Every node through the operator and then its own reading, taken by a new publisher pod.
    rc, doc, out = upgrade(root, tmp_path, FINAL)
    assert rc == 0, out
    assert "then inspect light on the node's own reading" in out, out
    assert doc["counts"] == {"done": len(before)}, out
    gates = [e for e in doc["log"] if e["action"].startswith("gate")]
    assert len(gates) == len(before) and all(
        e["action"] == "gate passed" and e["detail"].endswith("; inspect light ok") for e in gates), gates
    assert {(n, v) for n, v in publishers.published if v == FINAL} == {(n, FINAL) for n in before}

    # A version the operator's validation passes but the node's NVML does not run: the canary's own
    # reading shows the old driver, its gate fails on the drift, it is rolled back (its reading then
    # at the old version again: it returns) and the rollout halts with every other node untouched.
    before = driver_pods(admin)
    rc, doc, out = upgrade(root, tmp_path, LAGS)
    assert rc == 1, out
    assert doc["counts"] == {"failed": 1, "skipped": len(before) - 1}, out
    canary = next(e["node"] for e in doc["log"] if e["action"] == "cordon")
    failed = next(e for e in doc["log"] if e["action"] == "gate FAILED")
    assert failed["node"] == canary and "upgrade-done" in failed["detail"], failed  # the operator passed it
    assert "driver-drift" in failed["detail"] and FINAL in failed["detail"], failed
    back = [e for e in doc["log"] if e["action"] == "gate passed"]
    assert [e["node"] for e in back] == [canary] and back[0]["detail"].endswith("inspect light ok"), back
    after = driver_pods(admin)
    assert G.driver_version(after[canary]) == FINAL
    assert all(p["metadata"]["uid"] == before[n]["metadata"]["uid"] for n, p in after.items() if n != canary)
    assert not any(n["spec"].get("unschedulable") for n in gpu_nodes(admin).values())
