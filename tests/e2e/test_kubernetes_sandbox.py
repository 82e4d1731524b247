"""End-to-end: the Kubernetes sandbox (`gpufleet sandbox up --kubernetes`): real etcd,
kube-apiserver, kube-controller-manager and kube-scheduler on loopback, kwok nodes shaped like the
sandbox stack's pool, the generated CRDs, the chaos backend's least-privilege ServiceAccount, and a
training Job whose pods kwok runs. Then `down` must leave no process, no listening port and no run
directory, also after `kill -9` of a half-way `up`.

Needs the programs `make kube-bins` builds (`make test` and `make e2e` build them first); no root:
every daemon listens on 127.0.0.1 and the state lives in a temporary folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import GPUFLEET, gpufleet, wait_until

from gpufleet.chaos.backends.kubernetes import KubernetesBackend, connection, rb_uncordon
from gpufleet.core.sandbox_contract import KubeSandboxState, kube_state_path, read_kube_state
from gpufleet.sandbox.kube import require_kube_paths
from gpufleet.sandbox.kube.api import KubeApi
from gpufleet.sandbox.kube.cluster import api_from_kubeconfig, crd_objects, established, node_ready

pytestmark = pytest.mark.sandbox


REPO = Path(__file__).resolve().parents[2]
STACK = "sandbox"
NODES = 6  # the sandbox stack's pool (4 + 1 spare) spread to 6: 5 compute, 1 spare


def listening_ports() -> set[int]:
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                out.add(int(fields[1].rsplit(":", 1)[1], 16))
    return out


def processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmd and state != "Z":
            text = cmd.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {text[:120]}")
    return found


def assert_nothing_left(state: KubeSandboxState, root: Path) -> None:
    assert processes_naming(state.base_dir) == []
    assert not set(state.ports.values()) & listening_ports()
    assert not Path(state.base_dir).exists()
    assert not kube_state_path(state.stack, root).exists()


@pytest.fixture(scope="module")
def kube_paths_built() -> None:
    try:
        require_kube_paths()
    except RuntimeError as e:
        pytest.fail(str(e))  # `make test` builds them first: missing is a failure, not a skip


@pytest.fixture(scope="module")
def sandbox(kube_paths_built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    root = tmp_path_factory.mktemp("kube-root")
    res = gpufleet(
        root, "sandbox", "up", "--kubernetes", "--stack", STACK, "--nodes", str(NODES), "--timeout", "180"
    )
    state: KubeSandboxState | None = None
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        state = read_kube_state(STACK, root)
        assert state.api_url is not None and state.api_url in res.stdout
        assert str(state.admin_kubeconfig) in res.stdout and str(state.chaos_kubeconfig) in res.stdout
        yield root, state
    finally:
        if state is None and kube_state_path(STACK, root).exists():
            state = read_kube_state(STACK, root)
        down = gpufleet(root, "sandbox", "down", "--kubernetes", "--stack", STACK)
        assert down.returncode == 0, down.stdout + down.stderr
        if state is not None:
            assert_nothing_left(state, root)


@pytest.fixture(scope="module")
def admin(sandbox: tuple[Path, KubeSandboxState]) -> Iterator[KubeApi]:
    _, state = sandbox
    assert state.admin_kubeconfig is not None
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as api:
        yield api


def test_nodes_ready_with_the_pools_labels_taints_and_capacity(
    sandbox: tuple[Path, KubeSandboxState], admin: KubeApi
) -> None:
    root, state = sandbox
    assert state.phase == "up"
    assert [p.name for p in state.processes] == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "gpufleet-remediation",  # the platform's remediation (the stand-in for NVSentinel)
        "kueue",  # Kueue's controller manager (tests/e2e/test_kubernetes_kueue.py)
        "gpu-operator",  # its upgrade controller (tests/e2e/test_upgrade_gpu_operator.py)
    ]
    nodes = {n["metadata"]["name"]: n for n in admin.list("Node")}
    assert sorted(nodes) == [f"gpu-{i}" for i in range(NODES)] == sorted(state.nodes)
    assert all(node_ready(n) for n in nodes.values())
    assert state.spare_nodes == ["gpu-5"]
    for name, n in nodes.items():
        labels = n["metadata"]["labels"]
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["gpufleet.io/leaf"].startswith("gpu-leaf-")
        assert labels["topology.kubernetes.io/zone"] == "sandbox-a"
        assert (labels.get("gpufleet.io/spare") == "true") == (name == "gpu-5")
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert n["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in n["spec"]["taints"]
    status = gpufleet(root, "sandbox", "status", "--kubernetes", "--stack", STACK)
    assert status.returncode == 0, status.stderr
    assert f"nodes: {NODES} ({NODES} Ready" in " ".join(status.stdout.split())


def test_crds_established(admin: KubeApi) -> None:
    want = {c["metadata"]["name"] for c in crd_objects(require_kube_paths())}
    assert len(want) == 41
    have = {c["metadata"]["name"] for c in admin.list("CustomResourceDefinition") if established(c)}
    assert want <= have


def test_chaos_service_account_patches_nodes_but_reads_no_secrets(
    sandbox: tuple[Path, KubeSandboxState],
) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    _, state = sandbox
    assert state.chaos_kubeconfig is not None and state.chaos_namespace == "gpufleet-gameday"
    conn = connection(None, state.chaos_kubeconfig, None)
    backend = KubernetesBackend(conn, state.chaos_namespace, "img", "ib{rail}", None)
    roles = {n.name: n.role for n in backend.nodes()}
    assert roles["gpu-5"] == "spare" and roles["gpu-0"] == "compute"
    backend.cordon("gpu-3").apply()
    assert backend.node_states()["gpu-3"].state.startswith("cordoned")
    rb_uncordon({"conn": conn, "node": "gpu-3"})
    # The node lifecycle controller lifts its node.kubernetes.io/unschedulable taint a moment later.
    wait_until("gpu-3 schedulable again", lambda: backend.node_states()["gpu-3"].schedulable, 30)

    core = client.CoreV1Api(config.new_client_from_config(config_file=state.chaos_kubeconfig))
    for call in (
        lambda: core.list_secret_for_all_namespaces(),
        lambda: core.list_namespaced_secret("kube-system"),
    ):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        core.list_namespaced_secret(state.chaos_namespace)
    assert err.value.status == 403


def _running(admin: KubeApi) -> dict[str, str]:
    """Running training pods (not being deleted): name -> node."""
    pods = admin.list("Pod", "default", labelSelector="job-name=gpufleet-training")
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def test_training_pods_run_and_are_replaced(sandbox: tuple[Path, KubeSandboxState], admin: KubeApi) -> None:
    _, state = sandbox
    first = wait_until("2 training pods Running", lambda: (r := _running(admin)) and len(r) == 2 and r, 30)
    assert not set(first.values()) & set(state.spare_nodes)  # compute nodes preferred
    assert state.training_job_name == "gpufleet-training"

    victim = sorted(first)[0]
    admin.delete("Pod", victim, "default")
    # The Job controller replaces it after its pod-failure back-off (10 s for the first failure).
    after_delete = wait_until(
        "a replacement for the deleted pod",
        lambda: (r := _running(admin)) and len(r) == 2 and victim not in r and r,
        60,
    )

    # An eviction by the chaos backend (policy/v1, honours the PDB): replaced too, not counted as a
    # failure (the Job's podFailurePolicy ignores DisruptionTarget).
    assert state.chaos_kubeconfig is not None and state.chaos_namespace is not None
    backend = KubernetesBackend(
        connection(None, state.chaos_kubeconfig, None), state.chaos_namespace, "img", "ib", None
    )
    evicted = sorted(after_delete)[0]

    def pdb_allows() -> bool:
        pdb = admin.get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/gpufleet-training")
        return int((pdb.get("status") or {}).get("disruptionsAllowed", 0)) >= 1

    wait_until("the PDB to allow one disruption", pdb_allows, 30)
    backend.evict(evicted, "default", None).apply()
    wait_until(
        "a replacement for the evicted pod",
        lambda: (r := _running(admin)) and len(r) == 2 and evicted not in r and r,
        60,
    )
    job = admin.get("/apis/batch/v1/namespaces/default/jobs/gpufleet-training")
    assert job["status"].get("failed") == 1  # the deletion counted, the eviction did not


def test_down_after_kill_9_of_up_leaves_nothing(kube_paths_built: None, tmp_path: Path) -> None:
    """`up` killed once the API server is recorded: `down` still stops every daemon it started."""
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(tmp_path)}
    up = subprocess.Popen(
        [GPUFLEET, "sandbox", "up", "--kubernetes", "--stack", STACK, "--nodes", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:

        def apiserver_recorded() -> KubeSandboxState | None:
            if not kube_state_path(STACK, tmp_path).exists():
                return None
            st = read_kube_state(STACK, tmp_path)
            return st if any(p.name == "kube-apiserver" for p in st.processes) else None

        state = wait_until("kube-apiserver in the state file", apiserver_recorded, 60, 0.05)
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait()
    assert state.phase == "creating"
    assert processes_naming(state.base_dir)  # the daemons outlive their starter
    down = gpufleet(tmp_path, "sandbox", "down", "--kubernetes", "--stack", STACK)
    assert down.returncode == 0, down.stdout + down.stderr
    assert_nothing_left(state, tmp_path)  # ports and run directory were recorded before any daemon
