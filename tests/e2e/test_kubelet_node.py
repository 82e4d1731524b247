"""End-to-end: a kubelet node of the Kubernetes sandbox (`sandbox up --kubernetes --kubelet-nodes 1`,
ADR 0081): the real kubelet v1.37.2 with containerd 2.4.2 and runc registers a node, runs real
containers of the sandbox's Debian image, reports their exit codes and termination messages through
the API server, keeps pods that do not tolerate its taint away, and leaves the host as it found it:
no firewall rule, no interface in the host's network namespace, and after `down` no process, cgroup
or mount point.

Needs root (cgroups, mount and network namespaces) and the programs `make kube-bins` builds.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chaoslib.exceptions import InvalidActivity
from e2e_support import gpufleet, kube_sandbox, wait_until
from test_kubernetes_sandbox import assert_nothing_left

from gpufleet.chaos.gpu import actions as gpu_actions
from gpufleet.chaos.ledger import Ledger
from gpufleet.chaos.node import actions as node_actions
from gpufleet.core.sandbox_contract import KubeSandboxState
from gpufleet.fleet.bundle.archive import read_manifest
from gpufleet.fleet.node_pod import GATE_APP, NodePod, gpu_requests
from gpufleet.fleet.upgrade.kube_driver import GpuOperatorDriver
from gpufleet.fleet.upgrade.model import Component
from gpufleet.sandbox.agent.fields import gpu_uuid
from gpufleet.sandbox.agents import AgentClient
from gpufleet.sandbox.kube import kubelet_node, require_kube_paths
from gpufleet.sandbox.kube.api import KubeApi, object_path
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig, node_ready

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="kubelet nodes need root (cgroups, namespaces)"),
]

STACK = "sandbox"
NODE = "gpu-0"  # the first pool's only compute node at --nodes 2 (gpu-1 is its spare)
NAMESPACE = "default"


def host_firewall() -> str:
    out = []
    for cmd in ("iptables-save", "ip6tables-save"):
        proc = subprocess.run([cmd], capture_output=True, text=True, check=False)
        # The counters and the dump's time change by themselves; the rules are what matters.
        out += [ln for ln in proc.stdout.splitlines() if not ln.startswith(("#", ":"))]
    return "\n".join(sorted(out))


def host_links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeSandboxState, dict[str, Any]]]:
    before = {"firewall": host_firewall(), "links": host_links(),
              "mount_points": {p for p in kubelet_node.NAMESPACE_TMPFS if Path(p).exists()}}
    with kube_sandbox(tmp_path_factory, "kubelet-root", STACK, "--nodes", "2", "--no-training",
                      "--no-gpu-operator", "--kubelet-nodes", "1") as (root, state, up):
        assert f"1 kubelet node(s) Ready: {NODE}" in up.stdout.replace("\n", " ")
        yield state, {**before, "root": root}
    assert_nothing_left(state, root)
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{kubelet_node.cgroup_prefix(state.run_id)}*"))
    assert {p for p in kubelet_node.NAMESPACE_TMPFS if Path(p).exists()} == before["mount_points"]


@pytest.fixture(scope="module")
def admin(sandbox: tuple[KubeSandboxState, dict[str, Any]]) -> Iterator[KubeApi]:
    state, _ = sandbox
    assert state.admin_kubeconfig is not None
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as api:
        yield api


def pod(name: str, script: str, *, tolerate: bool = True, host_network: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostNetwork": host_network,
        "containers": [{"name": "c", "image": kubelet_node.NODE_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", script]}],
    }
    if tolerate:
        spec["tolerations"] = [{"key": kubelet_node.KUBELET_NODE_LABEL, "operator": "Exists"},
                               {"key": "nvidia.com/gpu", "operator": "Exists"}]  # the pool's taint
        spec["nodeSelector"] = {kubelet_node.KUBELET_NODE_LABEL: "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}


def finished(api: KubeApi, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = api.get(object_path("Pod", name, NAMESPACE))
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(f"pod {name} to finish", done, 60)


def test_the_node_is_a_real_kubelet_with_containerd(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    state, _ = sandbox
    assert state.kubelet_nodes == [NODE]
    assert [p.name for p in state.processes][-5:] == [f"containerd-{NODE}", f"stream-relay-{NODE}",
                                                       f"agent-{NODE}", f"kubelet-{NODE}",
                                                       f"device-plugin-{NODE}"]
    assert state.nodes == ["gpu-0", "gpu-1"]
    node = admin.get(object_path("Node", NODE))
    assert node_ready(node)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    labels = node["metadata"]["labels"]
    assert labels[kubelet_node.KUBELET_NODE_LABEL] == "true"
    # A node of the stack's pool: its labels (those feature discovery sets included), its GPU taint
    # and its GPUs, beside the kubelet node's own taint.
    assert labels["gpufleet.io/pool"] == "gpu" and labels["nvidia.com/gpu.present"] == "true"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"  # from the device plugin (ADR 0091)
    # .get: a taint may have no value (node.kubernetes.io/not-ready, for a moment after Ready).
    taints = [{k: t.get(k) for k in ("key", "value", "effect")} for t in node["spec"].get("taints") or []]
    assert kubelet_node.node_taint() in taints
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints


def test_containers_run_and_report_through_the_api_server(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    _, before = sandbox
    admin.create(pod("ok", "echo -n step-1-ok > /dev/termination-log; "
                           "grep -q 'ID=debian' /etc/os-release"))
    admin.create(pod("fails", "exit 3"))
    admin.create(pod("host-net", "test -e /proc/net/dev", host_network=True))
    ok, fails, host_net = (finished(admin, n) for n in ("ok", "fails", "host-net"))

    assert ok["status"]["phase"] == "Succeeded", ok["status"]
    term = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["message"]) == (0, "step-1-ok")
    assert ok["spec"]["nodeName"] == NODE
    assert ok["status"]["podIP"].startswith("10.143.0.")  # the node's own pod network
    assert fails["status"]["phase"] == "Failed"
    assert fails["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert host_net["status"]["phase"] == "Succeeded", host_net["status"]

    # The node's network and firewall are its own: nothing appeared in the host's.
    assert host_links() == before["links"]
    assert host_firewall() == before["firewall"]


def test_pods_that_do_not_tolerate_the_taint_stay_off(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    manifest = pod("untolerated", "true", tolerate=False)
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    admin.create(manifest)

    def unschedulable() -> str | None:
        conds = admin.get(object_path("Pod", "untolerated", NAMESPACE))["status"].get("conditions") or []
        return next((c["message"] for c in conds
                     if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"), None)

    # The node the selector names carries the kubelet node's taint (and the pool's GPU taint).
    message = wait_until("the scheduler to refuse the pod", unschedulable, 30)
    assert "had untolerated taint" in message
    assert "nodeName" not in admin.get(object_path("Pod", "untolerated", NAMESPACE))["spec"]


def smoke_pod(deadline_s: float) -> NodePod:
    """gpufleet's own one-step training run (smoke.py --standalone, 2 ranks over gloo on the pod's
    loopback) in the node image, with this machine's Python environment mounted read-only."""
    return NodePod(image=kubelet_node.NODE_IMAGE, image_pull_policy="Never", deadline_s=120,
                   command=kubelet_node.smoke_command(NODE, 8, 2, deadline_s), namespace=NAMESPACE,
                   env=kubelet_node.SMOKE_ENV, host_paths=kubelet_node.python_env_paths())


def test_the_gates_smoke_pod_runs_a_training_step_on_the_node(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi, tmp_path: Path
) -> None:
    state, _ = sandbox
    assert state.admin_kubeconfig is not None
    good = GpuOperatorDriver(Path(state.admin_kubeconfig), Component.DRIVER, tmp_path / "cordons.json",
                             smoke=smoke_pod(60.0))
    passed, detail = good.smoke_pod(NODE)
    assert passed, detail
    assert "smoke run ok: 2 rank(s), step 1 loss" in detail and "checkpoint verified" in detail
    # It asked for the node's 8 GPUs, and the kubelet admitted it against the GPUs the node advertises.
    assert gpu_requests(admin.get(object_path("Node", NODE))) == {"nvidia.com/gpu": "8"}

    # A step that cannot finish in time (torch's import alone takes longer): the pod exits 1 and
    # its verdict says why; either way the pod is removed.
    bad = GpuOperatorDriver(Path(state.admin_kubeconfig), Component.DRIVER, tmp_path / "cordons.json",
                            smoke=smoke_pod(0.3))
    passed, detail = bad.smoke_pod(NODE)
    assert not passed
    assert "smoke pod exit 1 (Error)" in detail and "rank 0 did not finish within 0.3 s" in detail

    def gone() -> bool:
        return not admin.list("Pod", NAMESPACE, labelSelector=f"app={GATE_APP}")

    wait_until("the smoke pods to be deleted", gone, 30)


def gpu_counts(api: KubeApi) -> tuple[str, str]:
    status = api.get(object_path("Node", NODE))["status"]
    return status["capacity"]["nvidia.com/gpu"], status["allocatable"]["nvidia.com/gpu"]


def test_the_device_plugin_hands_out_the_agents_gpus_and_an_unhealthy_one_fails_the_gate(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi, tmp_path: Path
) -> None:
    state, _ = sandbox
    assert state.admin_kubeconfig is not None
    nl = kubelet_node.layout(state.run_id, Path(state.base_dir), NODE, 0, state.ports)
    # The kubelet asked the plugin for two of its GPUs: the container sees their UUIDs, the ones the
    # node's agent publishes in its metrics.
    two = pod("two-gpus", 'printf %s "$NVIDIA_VISIBLE_DEVICES" > /dev/termination-log')
    two["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    admin.apply(two)
    done = finished(admin, "two-gpus")
    assert done["status"]["phase"] == "Succeeded"
    seen = done["status"]["containerStatuses"][0]["state"]["terminated"]["message"].split(",")
    assert len(seen) == 2 and set(seen) <= {gpu_uuid(NODE, i) for i in range(8)}, seen
    admin.request("DELETE", object_path("Pod", "two-gpus", NAMESPACE))

    agent = AgentClient(nl.agent_socket, nl.agent_token.read_text().strip())
    try:
        # XID 43 on GPU 5 is an application error (NVIDIA's device plugin skips it): GPU 5 stays
        # Healthy. XID 79 (fallen off the bus) on GPU 3: the plugin reports it Unhealthy; the kubelet
        # keeps it in the capacity and takes it out of the allocatable.
        agent.inject({"gpu": 5, "field_id": 230, "value": 43, "kmsg": True})
        agent.inject({"gpu": 3, "field_id": 230, "value": 79, "kmsg": True})
        wait_until("GPU 3 to leave the allocatable", lambda: gpu_counts(admin) == ("8", "7") or None, 30)
        driver = GpuOperatorDriver(Path(state.admin_kubeconfig), Component.DRIVER, tmp_path / "cordons.json",
                                   smoke=smoke_pod(60.0))
        passed, detail = driver.smoke_pod(NODE)
        assert not passed, detail  # it asks for all 8: the kubelet's device manager cannot admit it
        assert "UnexpectedAdmissionError" in detail and "Requested: 8, Available: 7" in detail, detail
        assert gpu_counts(admin) == ("8", "7")  # seconds later: GPU 5 was never taken out
        agent.clear()  # a GPU reset: the plugin reports GPU 3 Healthy again
        wait_until("every GPU back in the allocatable", lambda: gpu_counts(admin) == ("8", "8") or None, 30)
    finally:
        agent.clear()
        agent.close()
    passed, detail = driver.smoke_pod(NODE)
    assert passed, detail


def test_chaos_on_the_kubelet_node_goes_through_its_agent_and_never_a_fault_pod(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi, tmp_path: Path
) -> None:
    state, extra = sandbox
    cfg = {"gpufleet_backend": "kubernetes", "gpufleet_stack": STACK,
           "gpufleet_sandbox_root": str(extra["root"]), "gpufleet_ledger": str(tmp_path / "faults.jsonl")}
    # Its containers share this machine's PID namespace: sysrq-b from a pod there would reboot it.
    with pytest.raises(InvalidActivity, match="machine itself"):
        node_actions.crash_node(NODE, configuration=cfg)
    assert Ledger(tmp_path / "faults.jsonl").pending() == []
    # The catalog's XID 79, through the node's agent: its device plugin takes the GPU out.
    out = gpu_actions.inject_gpu_fault("gpu-xid-79", NODE, 2, configuration=cfg)
    try:
        (rec,) = Ledger(tmp_path / "faults.jsonl").pending()
        assert rec.params["node_kind"] == "sandbox-kubelet", out
        wait_until("GPU 2 to leave the allocatable", lambda: gpu_counts(admin) == ("8", "7") or None, 30)
        assert not admin.list("Pod", state.chaos_namespace or "gpufleet-gameday")  # no fault pod
    finally:
        gpu_actions.clear_gpu_faults(NODE, configuration=cfg)
    assert Ledger(tmp_path / "faults.jsonl").pending() == []
    wait_until("GPU 2 back in the allocatable", lambda: gpu_counts(admin) == ("8", "8") or None, 30)


def test_pod_logs_come_through_the_api_server_and_into_the_nodes_bundle(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi, tmp_path: Path
) -> None:
    """The node's address (127.0.0.1, where its kubelet serves) lets the API server read its pods'
    logs; the node's diagnostic bundle, collected as remediation's hook does with the bundle
    collector's own identity, holds each container's log, the crashed instance's included."""
    state, _ = sandbox
    node = admin.get(object_path("Node", NODE))
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
    # Fails once (its marker on an emptyDir, which outlives the container), then runs: a pod that
    # restarted, as one after a fault (a terminated pod's earlier containers are removed, and their
    # logs with them).
    first = "first-run: Xid 79, GPU has fallen off the bus"
    manifest = pod("crash-once", "if [ -e /m/ran ]; then echo second-run ok; exec sleep 300; fi; "
                                 f"touch /m/ran; echo '{first}' >&2; exit 3")
    manifest["spec"]["restartPolicy"] = "Always"
    manifest["spec"]["terminationGracePeriodSeconds"] = 0
    manifest["spec"]["volumes"] = [{"name": "m", "emptyDir": {}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "m", "mountPath": "/m"}]
    admin.create(manifest)

    def restarted_and_running() -> bool:
        st = (admin.get(object_path("Pod", "crash-once", NAMESPACE))["status"].get("containerStatuses")
              or [{}])[0]
        return bool(st.get("restartCount") == 1 and "running" in (st.get("state") or {}))

    wait_until("the pod to fail once and run again", restarted_and_running, 60)

    path = f"{object_path('Pod', 'crash-once', NAMESPACE)}/log"
    now, before = (admin.request("GET", path, params={"container": "c", "previous": p})
                   for p in ("false", "true"))
    assert (now.status_code, now.text) == (200, "second-run ok\n")
    assert (before.status_code, before.text) == (200, f"{first}\n")

    kubeconfig = Path(state.base_dir) / "kubeconfigs" / "bundle.kubeconfig"
    for name in (NODE, "gpu-1"):  # the kubelet node, and the kwok node beside it
        argv = [sys.executable, "-m", "gpufleet.fleet.bundle", "--kubeconfig", str(kubeconfig),
                "--node", name, "--out", str(tmp_path), "--trigger", "remediation"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
    by_node = {read_manifest(p).node: p for p in tmp_path.glob("bundle-*.tar.gz")}
    assert sorted(by_node) == [NODE, "gpu-1"]
    for p in by_node.values():
        assert read_manifest(p).member("kube-pod-logs").status == "ok"
    with tarfile.open(by_node[NODE]) as tar:
        f = tar.extractfile("kube/pod-logs.txt")
        assert f is not None
        logs = f.read().decode()
    assert ("==> default/crash-once container c (previous instance) <==\n"
            f"{first}\n"
            "==> default/crash-once container c <==\nsecond-run ok\n") in logs
    with tarfile.open(by_node["gpu-1"]) as tar:
        f = tar.extractfile("kube/pod-logs.txt")
        assert f is not None
        assert "the node publishes no kubelet endpoint" in f.read().decode()
    assert admin.request("DELETE", object_path("Pod", "crash-once", NAMESPACE)).status_code == 200


def test_kubectl_exec_runs_in_the_container_through_the_api_server(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    """The real kubectl's exec: API server, kubelet, then containerd's streaming server in the node's
    namespace through the node's stream relay; stdin in, stdout, stderr and the exit code back."""
    state, _ = sandbox
    running_pod(admin, pod("exec-target", "echo ready > /tmp/mark; exec sleep 300"))
    kubectl = kubectl_argv(state)
    script = "cat /tmp/mark; read line; echo \"got $line\"; echo to-stderr >&2; exit 7"
    proc = subprocess.run([*kubectl, "exec", "-i", "exec-target", "-c", "c", "--", "/bin/sh", "-c", script],
                          input="from-stdin\n", capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (7, "ready\ngot from-stdin\n"), proc
    assert proc.stderr.splitlines()[0] == "to-stderr", proc  # then kubectl's own line on the exit code
    assert admin.request("DELETE", object_path("Pod", "exec-target", NAMESPACE)).status_code == 200


def kubectl_argv(state: KubeSandboxState) -> list[str]:
    assert state.admin_kubeconfig is not None
    return [str(require_kube_paths(unused=frozenset({"kueue"})).binaries["kubectl"]),
            "--kubeconfig", state.admin_kubeconfig, "-n", NAMESPACE]


def running_pod(admin: KubeApi, manifest: dict[str, Any]) -> None:
    manifest["spec"]["terminationGracePeriodSeconds"] = 0
    admin.create(manifest)
    name = manifest["metadata"]["name"]

    def ready() -> bool:
        st = admin.get(object_path("Pod", name, NAMESPACE))["status"]
        statuses = st.get("containerStatuses") or [{}]
        return st.get("phase") == "Running" and all(c.get("ready") for c in statuses)

    wait_until(f"pod {name} to run and be ready", ready, 60)


def test_kubectl_port_forward_reaches_a_port_inside_the_pod(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    """The real kubectl's port-forward: kubelet, containerd's streaming server (through the node's
    stream relay), then the pod's own loopback, which nothing else reaches."""
    state, _ = sandbox
    manifest = pod("pf-target", "mkdir -p /srv && echo pf-ok > /srv/mark && "
                                "exec python3 -m http.server 8000 --bind 127.0.0.1 -d /srv")
    # Ready once it serves: kubectl port-forward gives up on a connection the pod refuses.
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/mark', timeout=2)"
    manifest["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["python3", "-c", probe]}, "periodSeconds": 1}
    running_pod(admin, manifest)
    with subprocess.Popen([*kubectl_argv(state), "port-forward", "pod/pf-target", ":8000",
                           "--address", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as forward:
        assert forward.stdout is not None
        first = forward.stdout.readline()  # "Forwarding from 127.0.0.1:<port> -> 8000"
        assert first.startswith("Forwarding from 127.0.0.1:") and first.rstrip().endswith("-> 8000"), first
        port = int(first.split("127.0.0.1:")[1].split()[0])

        def served() -> str | None:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/mark", timeout=5)
            except httpx.HTTPError:
                return None
            return r.text if r.status_code == 200 else None

        try:
            assert wait_until("the pod's server through port-forward", served, 30) == "pf-ok\n"
        finally:
            forward.terminate()
    assert admin.request("DELETE", object_path("Pod", "pf-target", NAMESPACE)).status_code == 200


def test_kubectl_attach_joins_the_running_container(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi
) -> None:
    """The real kubectl's attach, the third use of containerd's streaming server: the container
    waits for a line on its stdin and answers on its stdout."""
    state, _ = sandbox
    manifest = pod("attach-target", "read line; echo \"attached: $line\"")  # then ends: so does attach
    manifest["spec"]["containers"][0].update(stdin=True, stdinOnce=True)
    running_pod(admin, manifest)
    proc = subprocess.run([*kubectl_argv(state), "attach", "-i", "attach-target", "-c", "c"],
                          input="hello\n", capture_output=True, text=True, timeout=60, check=False)
    assert "attached: hello" in proc.stdout, proc
    assert admin.request("DELETE", object_path("Pod", "attach-target", NAMESPACE)).status_code == 200


def test_the_node_pod_brings_back_what_only_the_node_holds(
    sandbox: tuple[KubeSandboxState, dict[str, Any]], admin: KubeApi, tmp_path: Path
) -> None:
    """`bundle collect --kubernetes --node-pod` (ADR 0085): a privileged pod on the node runs the
    real-node table there and its archive comes back through its log: the node's kernel log (this
    machine's, which the kubelet node is), the vendor's tools said to be missing; the pod removed."""
    _, extra = sandbox
    res = gpufleet(extra["root"], "bundle", "collect", "--stack", STACK, "--kubernetes", "--node", NODE,
                   "--node-pod", "--out", str(tmp_path), "--json", timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    member = next(m for m in doc["manifest"]["members"] if m["collector"] == "node-pod")
    assert member["status"] == "ok" and member["name"] == "node/bundle.tar.gz", member
    with tarfile.open(doc["path"]) as outer:
        f = outer.extractfile("node/bundle.tar.gz")
        assert f is not None
        data = f.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as inner:
        m = inner.extractfile("manifest.json")
        assert m is not None
        manifest = json.load(m)
        status = {x["collector"]: x for x in manifest["members"]}
        assert (manifest["node"], manifest["source"], manifest["trigger"]) == (NODE, "nvidia", "node-pod")
        assert status["dmesg"]["status"] == "ok", status["dmesg"]
        kmsg = inner.extractfile("kernel/dmesg.txt")
        assert kmsg is not None and kmsg.read().strip()  # privileged: the kernel's ring buffer
        # The node image has no NVIDIA tools; a site's image does (bundle.nodePod).
        assert status["nvidia-smi-q"]["status"] == "failed"
        assert "No such file" in (status["nvidia-smi-q"]["error"] or "")
    assert not admin.list("Pod", labelSelector="app=gpufleet-bundle")  # every namespace

    # A kwok node runs no container: refused before anything is collected.
    res = gpufleet(extra["root"], "bundle", "collect", "--stack", STACK, "--kubernetes", "--node", "gpu-1",
                   "--node-pod", "--out", str(tmp_path / "kwok"))
    assert res.returncode == 2 and "gpu-1 is a kwok node" in res.stderr, res.stderr
    assert not (tmp_path / "kwok").exists()
