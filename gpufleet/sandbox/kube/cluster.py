"""`gpufleet sandbox up|down|status --kubernetes`: a real Kubernetes control plane on loopback with
kwok nodes shaped like the stack's pools (docs/kubernetes-sandbox.md, ADR 0034).

Order (what waits on what):
  certificates, kubeconfigs, kwok config ─► etcd (/health) ─► kube-apiserver (/readyz)
  ─► kwok's RBAC ─► controller manager, scheduler (/healthz) ─► kwok (/healthz)
  ─► CRDs (Established) ─► namespaces, chaos ServiceAccount + token ─► remediation
  ─► Kueue (its certificate mounted) ─► nodes (Ready) ─► kubelet nodes (Ready; --kubelet-nodes)
  ─► Kueue's queues, Kueue ready
  ─► training Job (suspended, Kueue admits it) + PDB (pods Running)

Crash safety, as for the Slurm sandbox: the state file (`<root>/<stack>/kubernetes/state.json`)
is written before the run directory exists and names it; each daemon is recorded as soon as it has
started, and a daemon started but not yet recorded is still found by `down`, because its command
line names the run's unique directory. `down` stops the recorded processes (after checking their
start time), then any such stray, then removes the run directory and the state file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.config.gpu_operator import UPGRADE_DONE, UPGRADE_STATE_LABEL, pinned_driver
from gpufleet.config.model import StackSpec
from gpufleet.core import procs
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inspect_contract import INSPECT_NAMESPACE, PUBLISHER_NAMESPACE, PUBLISHER_SERVICE_ACCOUNT
from gpufleet.core.sandbox_contract import (
    KubeSandboxState,
    Launch,
    SandboxProcess,
    kube_state_path,
    read_kube_state,
    state_root,
    write_kube_state,
)
from gpufleet.core.yamlio import safe_load_all
from gpufleet.sandbox import processes, rootfs, run_teardown
from gpufleet.sandbox.agents import AgentClient, write_token
from gpufleet.sandbox.kube import daemons, gpu_operator, kubelet_node, kueue, oci_archive, rbac, workload
from gpufleet.sandbox.kube.api import ApiError, KubeApi, object_path, owned_by, ssl_context
from gpufleet.sandbox.kube.binaries import KubePaths, require_kube_paths
from gpufleet.sandbox.kube.daemons import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    GPU_OPERATOR,
    KUEUE,
    KWOK,
    SCHEDULER,
    KubeLayout,
)
from gpufleet.sandbox.kube.kubeconfig import kubeconfig, write_kubeconfig
from gpufleet.sandbox.kube.kwok_config import NODE_SELECTOR, kwok_config_text
from gpufleet.sandbox.kube.nodes import KwokNode, plan_nodes, plan_storage_nodes
from gpufleet.sandbox.kube.pki import issue_files, node_cert_specs, write_pki
from gpufleet.sandbox.kube.versions import load_versions
from gpufleet.sandbox.layout import new_run_id, xid_overrides_json
from gpufleet.sandbox.processes import Timings
from gpufleet.sandbox.readiness import wait_for
from gpufleet.sandbox.run_teardown import RunDownReport

# What `down` may stop when it finds one of them naming the run's directory (a daemon `up` started
# but had no time to record): the Kubernetes programs, and Python (the remediation stand-in).
PROGRAMS = frozenset({*daemons.DAEMONS, "python", kubelet_node.KUBELET, kubelet_node.CONTAINERD})
REMEDIATION = "gpufleet-remediation"  # the process: the sandbox's stand-in for NVSentinel (remediation.py)
CHAOS_TOKEN_SECONDS = 24 * 3600  # the chaos backend's token; `status` shows when it expires
NODE_WORKERS = 8  # concurrent node creations (the API server's own limit is 400 in flight)
CRD_WORKERS = 4


class KubeSandboxError(RuntimeError):
    """A Kubernetes sandbox operation cannot proceed; the message says what to do."""


@dataclass
class KubeUpOptions:
    nodes: int | None = None  # None: the stack's pools as they are
    timeout_s: float = 300.0  # for the whole bring-up
    training: bool = True
    crds: bool = True
    # The sandbox's own stand-ins for what the platform deploys: the chaos backend's identity, the
    # remediation, Kueue and its queues (and so the training Job). False (`--cluster-only`): the
    # control plane, the CRDs and the nodes only, for the Pulumi program to deploy the platform
    # onto without meeting objects of the same names the sandbox made (docs/pulumi.md).
    platform: bool = True
    # The GPU Operator (NVIDIA stacks, with the platform): None runs it up to
    # GPU_OPERATOR_MAX_NODES nodes. Its first pass costs little at 6 nodes (1.6 s) and 262 s at 1,250
    # (two DaemonSet pods per node and a label write per node; benchmarks/kube_sandbox.py, 2026-12-05).
    gpu_operator: bool | None = None
    # The first pool's last N compute nodes run by a real kubelet with containerd and runc instead of
    # kwok (kubelet_node.py).
    kubelet_nodes: int = 0


MAX_KUBELET_NODES = 4  # each is a kubelet, a containerd and their pods on a 2-core machine


# Above this many nodes the GPU Operator runs only when asked for (`--gpu-operator`).
GPU_OPERATOR_MAX_NODES = daemons.LARGE_SANDBOX_NODES


def wants_gpu_operator(opts: KubeUpOptions, spec: StackSpec, nodes: int) -> bool:
    """Whether `up` runs the GPU Operator (pure)."""
    if not (opts.crds and opts.platform and gpu_operator.nvidia_pools(spec)):
        return False
    return opts.gpu_operator if opts.gpu_operator is not None else nodes <= GPU_OPERATOR_MAX_NODES


class KubeRecorder:
    """The run's KubeSandboxState, persisted at every change (atomic replace)."""

    def __init__(self, state: KubeSandboxState, root: Path | None = None) -> None:
        self._state = state
        self._root = root
        self._lock = threading.RLock()  # add_process reads and updates under one hold
        self.path = write_kube_state(state, root)

    @property
    def state(self) -> KubeSandboxState:
        with self._lock:
            return self._state.model_copy(deep=True)

    def update(self, **fields: object) -> None:
        with self._lock:
            merged = {**self._state.model_dump(), **fields}
            self._state = KubeSandboxState.model_validate(merged)
            write_kube_state(self._state, self._root)

    def add_process(self, proc: SandboxProcess) -> None:
        with self._lock:
            self.update(processes=[*self._state.processes, proc])


def existing_kube(stack: str, root: Path | None = None) -> tuple[KubeSandboxState | None, str | None]:
    """(state, None), (None, None) when there is no Kubernetes sandbox, or (None, why unreadable)."""
    path = kube_state_path(stack, root)
    if not path.exists():
        return None, None
    try:
        return read_kube_state(stack, root), None
    except (OSError, ValueError) as e:
        return None, f"{path}: {e}"


# ----------------------------------------------------------------------------- bring-up


@dataclass
class _Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


def _log_tail(log: Path, lines: int = 8) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  | " + "\n  | ".join(text) if text else ""


class _Run:
    """One bring-up: the layout, the recorder, the daemons started so far."""

    def __init__(self, lay: KubeLayout, paths: KubePaths, rec: KubeRecorder, deadline: float) -> None:
        self.lay = lay
        self.paths = paths
        self.rec = rec
        self.deadline = deadline
        self.started: list[_Daemon] = []

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        env = {**processes.base_env(), **(env or {})}
        recipe = Launch(program=argv, env=env, log=str(self.lay.log(name)))
        popen, st = procs.launch(recipe)
        if st is None:
            popen.wait(timeout=5)
            log = Path(recipe.log)
            raise KubeSandboxError(
                f"{name} exited at once with code {popen.returncode}; see {log}{_log_tail(log)}"
            )
        self.rec.add_process(SandboxProcess(name=name, pid=popen.pid, start_time=st, launch=recipe))
        self.started.append(_Daemon(name, popen, Path(recipe.log)))

    def check_alive(self) -> None:
        for d in self.started:
            code = d.popen.poll()
            if code is not None:
                raise KubeSandboxError(
                    f"{d.name} exited with code {code} during bring-up; see {d.log}{_log_tail(d.log)}"
                )

    def wait(
        self, what: str, check: Callable[[], Any], interval_s: float = 0.2, daemon: str | None = None
    ) -> Any:
        def probe() -> Any:
            self.check_alive()
            return check()

        try:
            return wait_for(what, probe, self.left(), interval_s)
        except KubeSandboxError:
            raise
        except TimeoutError as e:
            where = f"; see {self.lay.log(daemon)}{_log_tail(self.lay.log(daemon))}" if daemon else ""
            raise KubeSandboxError(f"{e}{where}") from None

    def wait_healthy(self, daemon: str, client: httpx.Client) -> None:
        url = self.lay.healthz_url(daemon)

        def healthy() -> bool:
            resp = client.get(url)
            if resp.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
            return True

        self.wait(f"{daemon} at {url}", healthy, 0.2, daemon)


def _write_files(lay: KubeLayout, cluster: str, live: daemons.Liveness) -> None:
    lay.base_dir.mkdir(mode=0o700, parents=True)
    write_pki(lay.pki, cluster)
    pki = lay.pki
    for who, name in (
        ("admin", "admin"),
        ("controller-manager", "controller-manager"),
        ("scheduler", "scheduler"),
        ("kwok", "kwok"),
    ):
        write_kubeconfig(
            lay.kubeconfig(who),
            kubeconfig(lay.api_url, pki.ca_cert, who, client_cert=pki.cert(name), client_key=pki.key(name)),
        )
    lay.kwok_config.parent.mkdir(parents=True, exist_ok=True)
    lay.kwok_config.write_text(kwok_config_text(live.lease_s))
    lay.etcd_dir.mkdir(mode=0o700)


def crd_objects(paths: KubePaths) -> list[dict[str, Any]]:
    out = []
    for f in paths.crd_files():
        for doc in safe_load_all(f.read_text()):  # libyaml: 0.5 s for the 41 files, not 8 s
            if doc:
                out.append(doc)
    return out


def established(crd: dict[str, Any]) -> bool:
    conds = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


def node_ready(node: dict[str, Any]) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _create_nodes(api: KubeApi, nodes: list[KwokNode]) -> None:
    def create(node: KwokNode) -> None:
        try:
            api.create(node.manifest())
        except ApiError as e:
            if e.status != 409:  # already there: a repeated call
                raise

    with ThreadPoolExecutor(NODE_WORKERS) as pool:
        list(pool.map(create, nodes))


def _running_pods(
    api: KubeApi, job: str = workload.JOB_NAME, job_uid: str | None = None
) -> list[dict[str, Any]]:
    """The Job's Running pods not being deleted; with `job_uid`, only those of that Job object (a
    replaced Job has the same name, and so the same job-name label, as the one before it)."""
    pods = api.list("Pod", workload.TRAINING_NAMESPACE, labelSelector=f"job-name={job}")
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and (job_uid is None or owned_by(p, job_uid))
    ]


def kube_up(
    stack: str,
    spec: StackSpec,
    options: KubeUpOptions | None = None,
    root: Path | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[KubeRecorder, Timings]:
    """Bring a Kubernetes sandbox up. On failure the state file (phase `failed`) still names
    everything made, so `down --kubernetes` removes it; the error names the daemon and its log."""
    opts = options or KubeUpOptions()
    prior, error = existing_kube(stack, root)
    if prior is not None or error is not None:
        which = f"run {prior.run_id}, phase {prior.phase}" if prior else error
        raise KubeSandboxError(
            f"a Kubernetes sandbox for stack {stack!r} already exists ({which}); "
            f"run `gpufleet sandbox down --kubernetes --stack {stack}` first"
        )
    nodes = plan_nodes(spec, opts.nodes)  # InputError before anything is made
    if not 0 <= opts.kubelet_nodes <= MAX_KUBELET_NODES:
        problem = Problem("kubelet_nodes", f"must be 0 to {MAX_KUBELET_NODES}, got {opts.kubelet_nodes}")
        raise InputError("--kubelet-nodes", [problem])
    try:
        kubelet_names = kubelet_node.choose(nodes, opts.kubelet_nodes)
    except ValueError as e:
        raise InputError("--kubelet-nodes", [Problem("kubelet_nodes", str(e))]) from None
    if opts.training and not opts.platform:
        problem = Problem("training", "the training Job needs the platform: add --no-training")
        raise InputError("--cluster-only", [problem])
    plan_storage_nodes(spec)  # likewise (a storage node named like a GPU node)
    compute_first_pool = sum(1 for n in nodes if not n.spare and n.pool == spec.node_pools[0].name)
    if opts.training and compute_first_pool == 0:
        raise InputError(
            "--nodes",
            [
                Problem(
                    "nodes",
                    f"{opts.nodes} nodes leave pool {spec.node_pools[0].name!r} (the training "
                    "Job's) no compute node: pass more, or --no-training",
                )
            ],
        )
    plan = workload.training_plan(spec, compute_first_pool)
    # KubeBinariesMissing names each program and `make kube-bins`; --cluster-only starts no Kueue.
    paths = require_kube_paths(unused=frozenset() if opts.platform else frozenset({KUEUE}))
    run_id = new_run_id()
    base = kube_state_path(stack, root).parent / f"run-{run_id}"
    lay = KubeLayout(stack, run_id, base,
                     daemons.free_ports(daemons.PORT_NAMES + kubelet_node.port_names(kubelet_names)))
    timings = Timings()
    rec = KubeRecorder(
        KubeSandboxState(
            stack=stack,
            run_id=run_id,
            phase="creating",
            base_dir=str(base),
            created_at=time.time(),
            kubernetes_version=load_versions().component("kubernetes").version,
            ports=dict(lay.ports),
        ),
        root,
    )
    run = _Run(lay, paths, rec, time.monotonic() + opts.timeout_s)
    try:
        _bring_up(run, spec, nodes, plan, opts, timings, say, frozenset(kubelet_names))
    except BaseException:
        rec.update(phase="failed")
        raise
    rec.update(phase="up")
    timings.mark("up")
    return rec, timings


def _bring_up(
    run: _Run,
    spec: StackSpec,
    nodes: list[KwokNode],
    plan: workload.TrainingPlan,
    opts: KubeUpOptions,
    timings: Timings,
    say: Callable[[str], None],
    kubelet_names: frozenset[str] = frozenset(),
) -> None:
    lay, bins, rec = run.lay, run.paths.binaries, run.rec
    pki = lay.pki
    live = daemons.liveness(len(nodes))
    _write_files(lay, spec.cluster.name, live)
    rec.update(api_url=lay.api_url, ca_file=str(pki.ca_cert), admin_kubeconfig=str(lay.kubeconfig("admin")))
    timings.mark("pki")

    probe = httpx.Client(verify=ssl_context(pki.ca_cert, pki.cert("admin"), pki.key("admin")), timeout=5)
    etcd_probe = httpx.Client(
        verify=ssl_context(pki.ca_cert, pki.cert("apiserver-etcd-client"), pki.key("apiserver-etcd-client")),
        timeout=5,
    )
    try:
        run.start(ETCD, daemons.etcd_argv(bins["etcd"], lay))
        run.wait_healthy(ETCD, etcd_probe)
        timings.mark("etcd")
        run.start(APISERVER, daemons.apiserver_argv(bins[APISERVER], lay))
        run.wait_healthy(APISERVER, probe)
        timings.mark("apiserver")
        say(f"run {lay.run_id}: kube-apiserver ready at {lay.api_url}")
        with KubeApi(lay.api_url, pki.ca_cert, pki.cert("admin"), pki.key("admin")) as api:
            for obj in [*rbac.kwok_objects(), *rbac.kubelet_api_objects()]:
                api.apply(obj)
            kcm = daemons.controller_manager_argv(bins[CONTROLLER_MANAGER], lay, live)
            run.start(CONTROLLER_MANAGER, kcm)
            run.start(SCHEDULER, daemons.scheduler_argv(bins[SCHEDULER], lay))
            run.start(KWOK, daemons.kwok_argv(bins[KWOK], lay, NODE_SELECTOR))
            for d in (CONTROLLER_MANAGER, SCHEDULER, KWOK):
                run.wait_healthy(d, probe)
            timings.mark("daemons")
            say("controller manager, scheduler and kwok healthy")

            if opts.crds:
                crds = crd_objects(run.paths)
                with ThreadPoolExecutor(CRD_WORKERS) as pool:
                    list(pool.map(api.apply, crds))
                names = {c["metadata"]["name"] for c in crds}

                def all_established() -> bool:
                    have = {
                        c["metadata"]["name"] for c in api.list("CustomResourceDefinition") if established(c)
                    }
                    missing = names - have
                    if missing:
                        raise RuntimeError(f"{len(missing)} not Established, e.g. {sorted(missing)[0]}")
                    return True

                run.wait(f"{len(crds)} CRDs Established", all_established, 0.3, APISERVER)
                timings.mark("crds")
                say(f"{len(crds)} CRDs applied and Established")

            if opts.platform:
                _chaos_identity(run, api, spec.gameday.namespace, workload.TRAINING_NAMESPACE)
                timings.mark("chaos_identity")
                _inspect_identity(run, api)
                _remediation(run, api, spec)
                timings.mark("remediation")
                who = rbac.REMEDIATION_SERVICE_ACCOUNT
                say(f"remediation ({spec.remediation.mode}) watching nodes as {who}")
            if opts.crds and opts.platform:  # Kueue needs its CRDs
                _start_kueue(run, api)
                timings.mark("kueue_started")
                say(f"kueue started as {kueue.NAMESPACE}/{kueue.SERVICE_ACCOUNT}, its certificate mounted")

            rec.update(nodes=[n.name for n in nodes], spare_nodes=[n.name for n in nodes if n.spare])
            # The stack's Ceph nodes too, unlabelled: the Pulumi program's node patches label them.
            storage = plan_storage_nodes(spec)
            kwok_nodes = [n for n in nodes if n.name not in kubelet_names]
            _create_nodes(api, [*kwok_nodes, *storage])
            timings.mark("nodes_created")
            want = {n.name for n in [*kwok_nodes, *storage]}

            def nodes_ready() -> bool:
                ready = {
                    n["metadata"]["name"]
                    for n in api.list("Node", labelSelector="type=kwok")
                    if node_ready(n)
                }
                left = want - ready
                if left:
                    raise RuntimeError(f"{len(left)} of {len(want)} nodes not Ready yet")
                return True

            run.wait(f"{len(want)} kwok nodes Ready", nodes_ready, 0.5, KWOK)
            timings.mark("nodes_ready")
            say(f"{len(want)} nodes Ready ({sum(n.spare for n in nodes)} spares)")
            if kubelet_names:
                tags = gpu_operator.image_tags(spec) if wants_gpu_operator(opts, spec, len(nodes)) else []
                _start_kubelet_nodes(run, api, spec, [n for n in nodes if n.name in kubelet_names], tags, say)
                timings.mark("kubelet_nodes")
            if opts.platform:
                _inspect_writers(run, api, [n.name for n in nodes])

            if wants_gpu_operator(opts, spec, len(nodes)):
                pools = set(gpu_operator.nvidia_pools(spec))
                gpu_nodes = [n.name for n in nodes if n.pool in pools]
                _start_gpu_operator(run, api, spec, gpu_nodes)
                timings.mark("gpu_operator")
                say(f"GPU Operator {gpu_operator.NAMESPACE}/{gpu_operator.SERVICE_ACCOUNT}: driver "
                    f"{pinned_driver(spec)} on {len(gpu_nodes)} nodes, upgrade controller done")

            queue: str | None = None
            if opts.crds and opts.platform:
                for obj in kueue.queue_objects(spec, nodes, workload.TRAINING_NAMESPACE):
                    api.apply(obj)
                run.wait_healthy(KUEUE, probe)
                queue = kueue.queue_name(spec)
                timings.mark("kueue")
                quota = kueue.quota_by_pool(spec, nodes)
                say(f"kueue ready: ClusterQueue and LocalQueue {queue}, GPU quota by pool {quota}")

            if opts.training:
                for obj in (workload.training_pdb(plan), workload.training_job(spec, plan, queue)):
                    api.apply(obj)
                rec.update(
                    training_namespace=workload.TRAINING_NAMESPACE, training_job_name=workload.JOB_NAME
                )

                def job_running() -> bool:
                    n = len(_running_pods(api))
                    if n < plan.replicas:
                        raise RuntimeError(f"{n} of {plan.replicas} training pods Running")
                    return True

                run.wait(
                    f"training Job {workload.JOB_NAME}: {plan.replicas} pods Running",
                    job_running,
                    0.3,
                    SCHEDULER,
                )
                timings.mark("training")
                say(f"training Job {workload.JOB_NAME}: {plan.replicas} pods Running")
    finally:
        probe.close()
        etcd_probe.close()


MERGE_PATCH = "application/merge-patch+json"


def _start_kubelet_nodes(run: _Run, api: KubeApi, spec: StackSpec, nodes: list[KwokNode],
                         image_tags: list[str], say: Callable[[str], None]) -> None:
    """Start each kubelet node (containerd, its images, its GPUs' agent, the kubelet, the device
    plugin) and wait until all are Ready with their GPUs advertised by the device plugin; then give
    each the planned labels its kubelet may not set (kubelet_node.split_labels) and its address."""
    models = {p.name: p.accelerator.value for p in spec.node_pools}
    overrides = xid_overrides_json(spec)
    lay, bins = run.lay, run.paths.binaries
    try:
        base = rootfs.rootfs_tar(say=lambda m: say(f"kubelet nodes' image: {m}"))
    except rootfs.RootfsError as e:
        raise KubeSandboxError(f"kubelet nodes: {e}") from None
    archive = lay.base_dir / "node-image.tar"
    oci_archive.write_archive(base, archive, kubelet_node.NODE_IMAGE, kubelet_node.SANDBOX_ENTRYPOINT)
    # containerd finds its shim on PATH.
    shim_path = f"{bins['containerd-shim-runc-v2'].parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    names = [n.name for n in nodes]
    run.rec.update(kubelet_nodes=names)  # before any is started: `down` then cleans up after them
    later: dict[str, dict[str, str]] = {}
    wanted: dict[str, tuple[str, str]] = {}  # each node's GPU resource and count
    for index, node in enumerate(nodes):
        name = node.name
        nl = kubelet_node.layout(lay.run_id, lay.base_dir, name, index, lay.ports)
        problem = kubelet_node.socket_problem(nl)
        if problem is not None:
            raise KubeSandboxError(f"kubelet node {name}: {problem}")
        client, serving = node_cert_specs(name)
        issue_files(lay.pki, (client, serving))
        kubelet_node.write_node_files(nl, bins["runc"], bins["loopback"].parent, lay.pki.ca_cert,
                                      lay.pki.cert(serving.name), lay.pki.key(serving.name), index)
        write_kubeconfig(nl.kubeconfig, kubeconfig(lay.api_url, lay.pki.ca_cert, client.common_name,
                                                   client_cert=lay.pki.cert(client.name),
                                                   client_key=lay.pki.key(client.name)))
        kubelet_node.make_cgroup(nl.cgroup)
        run.start(f"{kubelet_node.CONTAINERD}-{name}", kubelet_node.containerd_argv(nl, bins["containerd"]),
                  env={"PATH": shim_path})
        containerd_pid = run.started[-1].popen.pid
        ctr = [str(bins["ctr"]), "--address", str(nl.socket), "--namespace", "k8s.io"]

        def serving_ctr(ctr: list[str] = ctr) -> bool:
            proc = subprocess.run([*ctr, "version"], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip()[-200:])
            return True

        run.wait(f"containerd of {name}", serving_ctr, 0.2, f"{kubelet_node.CONTAINERD}-{name}")
        relay = f"{kubelet_node.STREAM_RELAY}-{name}"
        run.start(relay, kubelet_node.stream_relay_argv(nl, containerd_pid))
        run.wait(f"the stream relay of {name}", nl.stream_relay_port_file.exists, 0.1, relay)
        try:
            kubelet_node.run_ctr(ctr, ["images", "import", str(archive)], run.left())
        except RuntimeError as e:
            raise KubeSandboxError(f"{name}: {e}") from None
        for tag in image_tags:
            kubelet_node.tag_image(ctr, tag)
        gpus = kubelet_node.gpu_resources(node.capacity)
        if len(gpus) != 1:
            raise KubeSandboxError(f"kubelet node {name}: one accelerator resource expected, got {gpus}")
        resource, count = next(iter(gpus.items()))
        wanted[name] = (resource, count)
        write_token(nl.agent_token)
        nl.agent_dir.mkdir(parents=True, exist_ok=True)
        agent = f"{kubelet_node.AGENT}-{name}"
        run.start(agent, kubelet_node.agent_argv(nl, containerd_pid, models[node.pool], int(count),
                                                 overrides))
        agent_client = AgentClient(nl.agent_socket, nl.agent_token.read_text().strip())

        def agent_up(client: AgentClient = agent_client, health: Path = nl.health_file) -> bool:
            return client.healthy() and health.exists()

        try:
            run.wait(f"the agent of {name}", agent_up, 0.1, agent)
        finally:
            agent_client.close()
        own, later[name] = kubelet_node.split_labels(node.labels)
        run.start(f"{kubelet_node.KUBELET}-{name}",
                  kubelet_node.kubelet_argv(nl, bins["kubelet"], containerd_pid,
                                            {**own, kubelet_node.KUBELET_NODE_LABEL: "true"}, node.taints))
        run.start(f"{kubelet_node.DEVICE_PLUGIN}-{name}",
                  kubelet_node.device_plugin_argv(nl, containerd_pid, resource, int(count)))

    def all_ready() -> bool:
        listed = api.list("Node", labelSelector=kubelet_node.KUBELET_NODE_LABEL)
        ready = {n["metadata"]["name"] for n in listed
                 if node_ready(n) and _advertises(n, *wanted[n["metadata"]["name"]])}
        left = set(names) - ready
        if left:
            raise RuntimeError(f"not Ready with their GPUs advertised yet: {', '.join(sorted(left))}")
        return True

    run.wait(f"{len(nodes)} kubelet node(s) Ready", all_ready, 0.5,
             f"{kubelet_node.DEVICE_PLUGIN}-{names[-1]}")
    for node in nodes:
        path = object_path("Node", node.name)
        resp = api.request("PATCH", path, {"metadata": {"labels": later[node.name]}}, MERGE_PATCH)
        if resp.status_code != 200:
            raise KubeSandboxError(f"{node.name}: labelling failed: HTTP {resp.status_code} "
                                   f"{resp.text[:200]}")
        # The address the kubelet serves on, which it refuses to report itself (a loopback node IP,
        # kubelet_node.kubelet_argv) and never overwrites: the API server reaches it there for pod
        # logs and exec. The GPUs are the device plugin's to advertise.
        status = {"addresses": kubelet_node.node_addresses()}
        resp = api.request("PATCH", f"{path}/status", {"status": status}, MERGE_PATCH)
        if resp.status_code != 200:
            raise KubeSandboxError(f"{node.name}: patching its address failed: HTTP {resp.status_code}")
    say(f"{len(nodes)} kubelet node(s) Ready: {', '.join(names)} (containerd and runc, image "
        f"{kubelet_node.NODE_IMAGE}; GPUs advertised by the device plugin)")


def _advertises(node: dict[str, Any], resource: str, count: str) -> bool:
    """Whether the node's status counts all `count` GPUs of `resource` in capacity and allocatable."""
    status = node.get("status") or {}
    return all(str((status.get(k) or {}).get(resource)) == count for k in ("capacity", "allocatable"))


def _chaos_identity(run: _Run, api: KubeApi, fault_namespace: str, training_namespace: str) -> None:
    """The chaos backend's namespace, ServiceAccount and roles; a token from TokenRequest; its
    kubeconfig in the run directory."""
    for obj in rbac.chaos_objects(fault_namespace, training_namespace):
        api.apply(obj)
    token, expires = api.token(fault_namespace, rbac.CHAOS_SERVICE_ACCOUNT, CHAOS_TOKEN_SECONDS)
    path = write_kubeconfig(
        run.lay.kubeconfig("chaos"),
        kubeconfig(
            run.lay.api_url,
            run.lay.pki.ca_cert,
            rbac.CHAOS_SERVICE_ACCOUNT,
            token=token,
            namespace=fault_namespace,
        ),
    )
    run.rec.update(
        chaos_kubeconfig=str(path),
        chaos_namespace=fault_namespace,
        chaos_service_account=rbac.CHAOS_SERVICE_ACCOUNT,
        chaos_token_expires_at=dt.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp(),
    )


def _inspect_identity(run: _Run, api: KubeApi) -> None:
    """The inspect namespace, its writer's ServiceAccount and Role, and the policy that holds each
    node's writer to its own ConfigMap."""
    for obj in rbac.inspect_objects():
        api.apply(obj)


def _inspect_writers(run: _Run, api: KubeApi, nodes: list[str]) -> None:
    """Per node, a kubeconfig with the writer's token bound to the Node, for the node's `gpufleet
    inspect --here --publish` (kwok nodes run no processes: whoever plays a node uses its own). On a
    cluster the DaemonSet's pod has the kubelet's token bound to the pod, which names its node too."""
    paths: dict[str, str] = {}
    for name in nodes:
        node = api.get(object_path("Node", name))
        token, _ = api.token(PUBLISHER_NAMESPACE, PUBLISHER_SERVICE_ACCOUNT, CHAOS_TOKEN_SECONDS,
                             bound_to={**node, "kind": "Node"})
        paths[name] = str(write_kubeconfig(
            run.lay.kubeconfig(f"inspect-{name}"),
            kubeconfig(run.lay.api_url, run.lay.pki.ca_cert, PUBLISHER_SERVICE_ACCOUNT, token=token,
                       namespace=INSPECT_NAMESPACE),
        ))
    run.rec.update(inspect_kubeconfigs=paths)


def _start_kueue(run: _Run, api: KubeApi) -> None:
    """Kueue's identity (the generated ClusterRole), a token, its configuration file, then the
    process; then the sandbox does a kubelet's part: once Kueue's certificate controller has filled
    the webhook Secret, its files go into Kueue's certDir (kueue.py)."""
    lay = run.lay
    role = rbac.cluster_role(safe_load_all(run.paths.rbac_file("kueue").read_text()))
    for obj in kueue.identity_objects(role):
        api.apply(obj)
    token, _ = api.token(kueue.NAMESPACE, kueue.SERVICE_ACCOUNT, CHAOS_TOKEN_SECONDS)
    write_kubeconfig(
        lay.kubeconfig("kueue"),
        kubeconfig(lay.api_url, lay.pki.ca_cert, kueue.SERVICE_ACCOUNT, token=token),
    )
    lay.kueue_cert_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cfg = kueue.configuration(
        lay.ports[daemons.KUEUE_HEALTH], lay.ports[daemons.KUEUE_WEBHOOK], str(lay.kueue_cert_dir)
    )
    lay.kueue_config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run.start(KUEUE, daemons.kueue_argv(run.paths.binaries[KUEUE], lay))

    def certificate() -> dict[str, bytes]:
        files = kueue.mounted_files(api.get(object_path("Secret", kueue.WEBHOOK_SECRET, kueue.NAMESPACE)))
        if files is None:
            raise RuntimeError(f"Secret {kueue.NAMESPACE}/{kueue.WEBHOOK_SECRET} has no certificate yet")
        return files

    files: dict[str, bytes] = run.wait("Kueue's webhook certificate", certificate, 0.3, KUEUE)
    for name, data in files.items():
        path = lay.kueue_cert_dir / name
        path.touch(mode=0o600)
        path.write_bytes(data)


def _start_gpu_operator(run: _Run, api: KubeApi, spec: StackSpec, gpu_nodes: list[str]) -> None:
    """The GPU Operator's identity, its ClusterPolicy and the DaemonSets it upgrades
    (gpu_operator.py), then the process; ready once its upgrade controller has labelled every GPU
    node's driver upgrade-done (its first pass: every driver pod up to date)."""
    lay = run.lay
    role = rbac.cluster_role(safe_load_all(run.paths.rbac_file(gpu_operator.CRD_SOURCE).read_text()))
    for obj in gpu_operator.identity_objects(role):
        api.apply(obj)
    token, _ = api.token(gpu_operator.NAMESPACE, gpu_operator.SERVICE_ACCOUNT, CHAOS_TOKEN_SECONDS)
    write_kubeconfig(
        lay.kubeconfig(GPU_OPERATOR),
        kubeconfig(lay.api_url, lay.pki.ca_cert, gpu_operator.SERVICE_ACCOUNT, token=token),
    )
    policy = api.apply(gpu_operator.cluster_policy(spec, len(gpu_nodes)))
    uid = str(policy["metadata"]["uid"])
    version = pinned_driver(spec)
    bad = spec.sandbox is not None and version in spec.sandbox.bad_versions
    api.apply(gpu_operator.driver_daemonset(version, uid, fails_to_load=bad))
    api.apply(gpu_operator.validator_daemonset(uid))
    run.start(GPU_OPERATOR, daemons.gpu_operator_argv(run.paths.binaries[GPU_OPERATOR], lay,
                                                      as_root=os.geteuid() == 0),
              env={"OPERATOR_NAMESPACE": gpu_operator.NAMESPACE})
    want = set(gpu_nodes)

    def labelled() -> bool:
        done = {n["metadata"]["name"] for n in api.list("Node")
                if n["metadata"].get("labels", {}).get(UPGRADE_STATE_LABEL) == UPGRADE_DONE}
        left = want - done
        if left:
            raise RuntimeError(f"{len(left)} of {len(want)} GPU nodes not {UPGRADE_DONE} yet, "
                               f"e.g. {min(left)}")
        return True

    run.wait(f"the GPU Operator's upgrade controller on {len(want)} nodes", labelled, 0.5, GPU_OPERATOR)


def remediation_policy_doc(spec: StackSpec) -> dict[str, Any]:
    """What the remediation stand-in reads: the stack's mode, circuit breaker and XID overrides (it
    resolves them against the catalog as every consumer of the XID policy does)."""
    rem = spec.remediation
    return {
        "mode": rem.mode,
        "circuitBreaker": rem.circuit_breaker.model_dump(mode="json", by_alias=True),
        "xidOverrides": {
            str(x): o.model_dump(mode="json", by_alias=True) for x, o in rem.xid_overrides.items()
        },
    }


def remediation_argv(lay: KubeLayout) -> list[str]:
    d = lay.base_dir / "remediation"
    # The node's diagnostic bundle before the quarantine, as the bundle collector's read-only identity.
    hook = [sys.executable, "-m", "gpufleet.fleet.bundle", "--kubeconfig", str(lay.kubeconfig("bundle")),
            "--stack", lay.stack, "--out", str(lay.base_dir / "bundles"), "--trigger", "remediation"]
    return [
        sys.executable,
        "-m",
        "gpufleet.sandbox.kube.remediation",
        f"--kubeconfig={lay.kubeconfig('remediation')}",
        f"--policy={d / 'policy.json'}",
        f"--status={d / 'status.json'}",
        f"--before-quarantine={shlex.join(hook)}",
    ]


def _remediation(run: _Run, api: KubeApi, spec: StackSpec) -> None:
    """The platform's remediation (the stand-in for NVSentinel's quarantine and drain): its
    ServiceAccount and ClusterRole, a token, its kubeconfig and policy file, then the process,
    recorded with its Launch recipe like the daemons; waited for until it has reconciled once."""
    for obj in [*rbac.remediation_objects(), *rbac.bundle_objects()]:
        api.apply(obj)
    ns, sa = rbac.REMEDIATION_NAMESPACE, rbac.REMEDIATION_SERVICE_ACCOUNT
    lay = run.lay
    for who, account in (("remediation", sa), ("bundle", rbac.BUNDLE_SERVICE_ACCOUNT)):
        token, _ = api.token(ns, account, CHAOS_TOKEN_SECONDS)
        write_kubeconfig(lay.kubeconfig(who), kubeconfig(lay.api_url, lay.pki.ca_cert, account, token=token))
    d = lay.base_dir / "remediation"
    d.mkdir(parents=True, exist_ok=True)
    (d / "policy.json").write_text(json.dumps(remediation_policy_doc(spec), indent=2, sort_keys=True))
    status = d / "status.json"
    run.rec.update(remediation_service_account=f"{ns}/{sa}", remediation_status=str(status))
    run.start(REMEDIATION, remediation_argv(lay))

    def reconciled() -> bool:
        if not status.exists():
            raise RuntimeError(f"no {status} yet")
        return True

    run.wait(f"{REMEDIATION} to reconcile once", reconciled, 0.2, REMEDIATION)


# ----------------------------------------------------------------------------- training


def restart_training(state: KubeSandboxState, spec: StackSpec, timeout_s: float = 120.0) -> float:
    """Replace the sandbox's training Job by a new one of the same size, submitted to the same Kueue
    queue, and wait until its pods run; returns the seconds it took.

    Why: the Job controller delays a replacement pod by 10 s x 2^(n-1) after the Job's n-th pod
    failure since its last success, evictions its podFailurePolicy ignores included, at most
    10 min (k8s.io/kubernetes pkg/controller/job/backoff_utils.go, DefaultJobPodFailureBackOff
    and MaxJobPodFailureBackOff); it keeps that count in memory per Job and drops it only when the
    Job finishes or is deleted, and training pods never succeed. Each fault a game-day injects on
    a sandbox that stays up would otherwise add to the next fault's recovery time (the fourth waits
    80 s, past the 60 s budgets). A new Job starts from none, as on a new sandbox."""
    if state.admin_kubeconfig is None or state.training_job_name is None:
        raise KubeSandboxError(f"the Kubernetes sandbox of {state.stack} runs no training Job")
    started = time.monotonic()
    deadline = started + timeout_s
    ns, name = state.training_namespace or workload.TRAINING_NAMESPACE, state.training_job_name
    with api_from_kubeconfig(Path(state.admin_kubeconfig)) as api:
        job = api.get(object_path("Job", name, ns))
        plan = workload.training_plan(spec, int(job["spec"]["parallelism"]))
        queue = (job["metadata"].get("labels") or {}).get(workload.QUEUE_LABEL)
        # Foreground: the Job is gone only once its pods (and Kueue's Workload) are.
        api.delete("Job", name, ns, propagation="Foreground")

        def gone() -> bool:
            return api.request("GET", object_path("Job", name, ns)).status_code == 404

        try:
            wait_for(f"training Job {name} deleted", gone, max(deadline - time.monotonic(), 0), 0.3)
            uid = api.apply(workload.training_job(spec, plan, queue, name=name))["metadata"]["uid"]
            wait_for(
                f"training Job {name}: {plan.replicas} pods Running",
                lambda: len(_running_pods(api, name, uid)) >= plan.replicas,
                max(deadline - time.monotonic(), 0),
                0.3,
            )
        except TimeoutError as e:
            raise KubeSandboxError(str(e)) from None
    return time.monotonic() - started


# ----------------------------------------------------------------------------- down


# Clients of the API server first, then the API server, then etcd: each drains cleanly when what
# talks to it is gone.
STOP_ORDER: tuple[str | None, ...] = (None, APISERVER, ETCD)


def kube_down(
    stack: str, root: Path | None = None, keep_files: bool = False, grace_s: float = 5.0
) -> RunDownReport | None:
    """Remove a stack's Kubernetes sandbox (any phase, idempotent). None if there is none."""
    state, error = existing_kube(stack, root)
    if state is None:
        if error is not None:
            raise KubeSandboxError(f"unreadable state file {error}; remove the run by hand")
        return None
    deleting = state.model_copy(update={"phase": "deleting"})

    def after_stop() -> list[str]:
        left = kubelet_node.remove_cgroups(state.run_id)
        if state.kubelet_nodes:
            kubelet_node.remove_mount_points()
        return left

    return run_teardown.remove_run(
        state,
        kube_state_path(stack, root),
        lambda: write_kube_state(deleting, root),
        STOP_ORDER,
        PROGRAMS,
        grace_s,
        keep_files,
        after_stop,
    )


# ----------------------------------------------------------------------------- status


def api_from_kubeconfig(path: Path, timeout: float = 10.0) -> KubeApi:
    """A client for the identity a kubeconfig of this sandbox names (certificate or token)."""
    cfg = yaml.safe_load(path.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    cert, key = user.get("client-certificate"), user.get("client-key")
    return KubeApi(
        cluster["server"],
        Path(cluster["certificate-authority"]),
        Path(cert) if cert else None,
        Path(key) if key else None,
        token=user.get("token"),
        timeout=timeout,
    )


def kube_status(state: KubeSandboxState) -> dict[str, Any]:
    """Live facts: which daemons run, and when the API server answers, node and pod counts."""
    out: dict[str, Any] = {
        "stack": state.stack,
        "run_id": state.run_id,
        "phase": state.phase,
        "base_dir": state.base_dir,
        "api_url": state.api_url,
        "admin_kubeconfig": state.admin_kubeconfig,
        "chaos_kubeconfig": state.chaos_kubeconfig,
        "chaos_token_expires_at": state.chaos_token_expires_at,
        "processes": {p.name: processes.alive(p) for p in state.processes},
        "rss_bytes": {
            p.name: processes.rss_bytes(p.pid) if processes.alive(p) else 0 for p in state.processes
        },
        "nodes": None,
        "pods": None,
        "error": None,
    }
    if state.admin_kubeconfig is None or not Path(state.admin_kubeconfig).exists():
        return out
    try:
        with api_from_kubeconfig(Path(state.admin_kubeconfig), timeout=5) as api:
            nodes = api.list("Node")
            out["nodes"] = {
                "total": len(nodes),
                "ready": sum(node_ready(n) for n in nodes),
                "cordoned": sum(bool((n.get("spec") or {}).get("unschedulable")) for n in nodes),
                "spares": len(state.spare_nodes),
            }
            phases: dict[str, int] = {}
            for p in api.list("Pod"):
                ph = (p.get("status") or {}).get("phase") or "Unknown"
                phases[ph] = phases.get(ph, 0) + 1
            out["pods"] = {"total": sum(phases.values()), **phases}
    except (httpx.HTTPError, ApiError, OSError, KeyError) as e:
        out["error"] = f"the API server did not answer: {e}"
    return out


def all_kube_stacks(root: Path | None = None) -> list[str]:
    """Stacks with a Kubernetes sandbox state file."""
    r = root or state_root()
    if not r.is_dir():
        return []
    return sorted(p.parent.parent.name for p in r.glob("*/kubernetes/state.json"))
