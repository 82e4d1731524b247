"""The sandbox's public interface: the state file `gpufleet sandbox up` writes.

Chaos backends, probes and the game-day talk to a running sandbox ONLY through this file and the
endpoints it names (agent control sockets, Prometheus on loopback, Slurm commands run inside the
head namespace), never through the sandbox package's internals (ARCHITECTURE.md layering).

Location: `<state_root>/<stack>/state.json`, state_root defaulting to `/run/gpufleet/sandboxes`
(override with GPUFLEET_SANDBOX_ROOT). The file is written before anything is created and updated
as each resource appears, so `down` can remove exactly what `up` made, even after a crash.

The Kubernetes sandbox (`gpufleet sandbox up --kubernetes`: a real control plane on loopback with
kwok nodes) has its own file, `<state_root>/<stack>/kubernetes/state.json` (`KubeSandboxState`),
so it runs beside the Slurm sandbox of the same stack and each `down` removes only its own run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_STATE_ROOT = "/run/gpufleet/sandboxes"


def state_root() -> Path:
    return Path(os.environ.get("GPUFLEET_SANDBOX_ROOT", DEFAULT_STATE_ROOT))


def state_path(stack: str, root: Path | None = None) -> Path:
    return (root or state_root()) / stack / "state.json"


KUBE_STATE_DIR = "kubernetes"


def kube_state_path(stack: str, root: Path | None = None) -> Path:
    """The Kubernetes sandbox's state file: a folder of its own beside the Slurm sandbox's file."""
    return (root or state_root()) / stack / KUBE_STATE_DIR / "state.json"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FabricLink(_M):
    rail: int
    ifname: str  # interface inside the node's namespace (what GLOO_SOCKET_IFNAME names)
    peer: str  # its veth peer on the fabric bridge (root namespace): `ip link set <peer> down` = cable pull
    address: str  # CIDR inside the namespace


class SandboxNode(_M):
    name: str  # Slurm node name and hostname, e.g. "gpu-0"
    role: Literal["compute", "spare", "serving", "head"]  # serving: a serving pool's node, outside Slurm
    netns: str
    mgmt_ifname: str
    mgmt_peer: str  # root-side veth of the management link
    mgmt_address: str  # CIDR
    fabric: list[FabricLink] = Field(default_factory=list)
    gpus: int = 0
    agent_socket: str | None = None  # HTTP over this unix socket: POST /inject, POST /clear, GET /state
    agent_metrics_url: str | None = None  # http://<mgmt ip>:<port>/metrics, reachable from the head ns
    kernel_log: str | None = None  # file the agent appends `NVRM: Xid` lines to (the node's kmsg)
    leaf: str | None = None  # leaf group: the nodes behind one set of leaf switches (switch-down)


class Launch(_M):
    """How a daemon is started: the one recipe `sandbox up` starts it with and a chaos rollback
    (node crash, reboot) starts it again with, so nothing is rebuilt or parsed back from /proc."""

    program: list[str]  # the daemon's own argv: what /proc/<pid>/cmdline shows once wrappers exec
    netns: str | None = None  # run inside this named network namespace
    hostname: str | None = None  # in a new UTS namespace with this hostname (a node's daemons)
    env: dict[str, str] = Field(default_factory=dict)  # the whole environment, verbatim
    cwd: str | None = None
    log: str  # stdout and stderr are appended here

    def argv(self) -> list[str]:
        """The program behind its namespace wrappers; each wrapper exec()s, so the PID is the
        daemon's."""
        out = list(self.program)
        if self.hostname is not None:
            out = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname, *out]
        if self.netns is not None:
            out = ["ip", "netns", "exec", self.netns, *out]
        return out


class SandboxProcess(_M):
    name: str  # e.g. "slurmd@gpu-0", "prometheus", "agent@gpu-1"
    pid: int
    start_time: int  # /proc/<pid>/stat field 22, to detect PID reuse after a crash
    netns: str | None = None
    launch: Launch  # how to start it again
    node: str | None = None  # the sandbox node it belongs to, if any


class Restart(_M):
    """One resubmission by the auto-resume controller."""

    t: float
    incarnation: int  # the incarnation submitted
    job_id: str  # the new job
    previous_job_id: str | None
    previous_state: str  # how the previous incarnation ended


class ControllerStatus(_M):
    """The auto-resume controller's status file (SandboxState.training_controller): written by
    gpufleet.sandbox.training.autoresume, read by the chaos backend's steady-state check."""


    pid: int
    incarnation: int = -1  # -1: nothing submitted yet
    job_id: str | None = None
    job_state: str | None = None
    ended_at: float | None = None  # when the current job was first seen over
    restarts: list[Restart] = Field(default_factory=list)
    budget_since: float = 0.0  # restarts before this time do not count against the budget
    gave_up: str | None = None  # why no job will be submitted any more
    finished: bool = False
    updated_at: float = 0.0


class SandboxState(_M):
    """Everything a running sandbox made, and how to reach it."""

    # 2: processes carry their Launch recipe (1 carried a wrapped argv that readers parsed back).
    version: Literal[2] = 2
    stack: str
    run_id: str  # short per-run prefix used in every name
    phase: Literal["creating", "up", "deleting", "failed"]
    base_dir: str  # run directory: configs, logs, spool, checkpoints
    created_at: float
    head_netns: str | None = None
    bridges: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    links: list[str] = Field(default_factory=list)  # root-side link names made by the run
    mounts: list[str] = Field(default_factory=list)
    nodes: list[SandboxNode] = Field(default_factory=list)
    processes: list[SandboxProcess] = Field(default_factory=list)
    slurm_conf: str | None = None  # set SLURM_CONF to this and run Slurm commands in head_netns
    prometheus_url: str | None = None  # http://127.0.0.1:<port> in the root namespace
    alertmanager_url: str | None = None
    agent_token_file: str | None = None  # bearer token for the agent control sockets
    checkpoint_dir: str | None = None
    # When the job checkpoints straight to S3: its location file (core.s3_job_checkpoints.S3Location,
    # mode 0600; the endpoint in it is the nodes' loopback relay, not the root namespace's radosgw).
    checkpoint_s3: str | None = None
    training_job_name: str | None = None
    training_events: str | None = None  # JSONL: {"t", "event", "step", "restart", "job_id", "node"}
    training_hosts_file: str | None = None  # JSON node -> rendezvous addresses (the ranks' --hosts-file)
    # JSON status of the auto-resume controller (process "autoresume"): incarnation, job id,
    # restarts; SIGHUP to it resets its restart budget.
    training_controller: str | None = None
    spare_nodes: list[str] = Field(default_factory=list)
    # The serving workload (sandbox.serving): HAProxy's frontend and its stats page, both on the head
    # namespace's management address (reach them from inside the head namespace).
    serving_url: str | None = None
    serving_stats_url: str | None = None
    serving_admin_socket: str | None = None  # HAProxy's runtime API (drain / ready a replica)

    def node(self, name: str) -> SandboxNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in sandbox {self.stack}; nodes: {[n.name for n in self.nodes]}")

    def slurm_command(self, *args: str) -> list[str]:
        """argv running a Slurm client command against this sandbox's controller."""
        if self.head_netns is None or self.slurm_conf is None:
            raise RuntimeError("this sandbox has no Slurm controller yet")
        return ["ip", "netns", "exec", self.head_netns, "env", f"SLURM_CONF={self.slurm_conf}", *args]


# Labels the Kubernetes sandbox puts on its kwok nodes for the chaos backend
# (gpufleet.chaos.backends.kubernetes reads spares by SPARE_LABEL; a unit test holds the two equal).
KUBE_SPARE_LABEL = "gpufleet.io/spare"
# The annotation that marks a node as simulated by kwok (kwok's own convention): the sandbox's kwok
# manages only nodes carrying it, and the chaos backend reads it to act on a node honestly (a
# simulated node runs no container: a fault pod could change nothing there, docs/adr/0036).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
# A kubelet node of the Kubernetes sandbox (ADR 0081) carries this label, and its folder in the run
# directory holds its GPUs' agent (ADR 0091). Its containers share this machine's PID namespace and
# kernel: a privileged fault pod there (sysrq, /dev/kmsg, nsenter into PID 1) would act on the
# machine itself, so the chaos backend injects there through the agent only.
KUBELET_NODE_LABEL = "gpufleet.io/kubelet-node"
KUBELET_AGENT_SOCKET = "agent.sock"
KUBELET_AGENT_TOKEN = "agent.token"
# The GPUs' health as a node agent publishes it in its state folder, for the processes that use
# the GPUs (training ranks, serving replicas, the device plugin) and for diagnostic bundles.
AGENT_HEALTH_FILE = "gpu-health.json"


def kubelet_node_dir(base_dir: Path, index: int) -> Path:
    """Kubelet node `index`'s folder: named by the index, not the node's name, which may be long:
    the sockets in it must stay under unix(7)'s 108 bytes."""
    return base_dir / f"kn{index}"


class KubeSandboxState(_M):
    """Everything a Kubernetes sandbox run made (processes, run directory), and how to reach it:
    the API server on loopback with TLS, the CA that signs it, an admin kubeconfig, and the chaos
    backend's own least-privilege kubeconfig (a ServiceAccount token, no access to secrets)."""

    version: Literal[1] = 1
    stack: str
    run_id: str
    phase: Literal["creating", "up", "deleting", "failed"]
    base_dir: str  # run directory: certificates, kubeconfigs, etcd data, logs; removed by `down`
    created_at: float
    kubernetes_version: str  # of the programs started (tools/kube/versions.toml)
    ports: dict[str, int] = Field(default_factory=dict)  # daemon -> 127.0.0.1 port, chosen at bring-up
    processes: list[SandboxProcess] = Field(default_factory=list)
    api_url: str | None = None  # https://127.0.0.1:<port>
    ca_file: str | None = None  # PEM: the run's CA, signs the API server's serving certificate
    admin_kubeconfig: str | None = None  # client certificate of group system:masters
    chaos_kubeconfig: str | None = None  # the chaos backend's ServiceAccount token (TokenRequest)
    chaos_namespace: str | None = None  # where fault pods run: the stack's game-day namespace
    chaos_service_account: str | None = None
    chaos_token_expires_at: float | None = None  # the token stops working then: `up` again
    # The nodes' inspect writer (core.inspect_contract), one kubeconfig per node: its token is bound
    # to the Node, so `gpufleet inspect --here --publish` with it may write that node's ConfigMap in
    # the inspect namespace and nothing else (ADR 0077).
    inspect_kubeconfigs: dict[str, str] = Field(default_factory=dict)
    nodes: list[str] = Field(default_factory=list)  # kwok node names, spares included
    spare_nodes: list[str] = Field(default_factory=list)  # labelled KUBE_SPARE_LABEL=true
    kubelet_nodes: list[str] = Field(default_factory=list)  # run by a real kubelet (kubelet_node.py)
    training_namespace: str | None = None
    training_job_name: str | None = None  # an Indexed Job whose pods kwok runs; PDB of the same name
    # The platform's remediation (the sandbox's stand-in for NVSentinel's quarantine and drain,
    # process "gpufleet-remediation"): its own ServiceAccount and what it last did.
    remediation_service_account: str | None = None
    remediation_status: str | None = None  # JSON (RemediationStatus), rewritten every reconcile

    def kubelet_agent(self, node: str) -> tuple[str, str] | None:
        """(control socket, token file) of a kubelet node's agent; None for any other node."""
        if node not in self.kubelet_nodes:
            return None
        folder = kubelet_node_dir(Path(self.base_dir), self.kubelet_nodes.index(node))
        return str(folder / KUBELET_AGENT_SOCKET), str(folder / KUBELET_AGENT_TOKEN)


class RemediationStatus(_M):
    """The sandbox remediation's status file (KubeSandboxState.remediation_status): written by
    gpufleet.sandbox.kube.remediation after every reconcile, read by `sandbox status`."""

    pid: int
    mode: str  # the stack's remediation mode
    updated_at: float = 0.0
    quarantined: dict[str, str] = Field(default_factory=dict)  # node -> catalog fault (or why)
    breaker_open: bool = False
    notes: list[str] = Field(default_factory=list)  # last reconcile: refusals, drains blocked


def read_kube_state(stack: str, root: Path | None = None) -> KubeSandboxState:
    return _read_versioned(kube_state_path(stack, root), KubeSandboxState, 1, "Kubernetes sandbox state file",
                           "`gpufleet sandbox down --kubernetes`")


def write_kube_state(state: KubeSandboxState, root: Path | None = None) -> Path:
    """Atomically replace the Kubernetes sandbox's state file (write, fsync, rename)."""
    path = kube_state_path(state.stack, root)
    _atomic_write(path, state.model_dump_json(indent=2))
    return path


def read_state(stack: str, root: Path | None = None) -> SandboxState:
    return _read_versioned(state_path(stack, root), SandboxState, 2, "state file", "`gpufleet sandbox down`")


_State = TypeVar("_State", SandboxState, KubeSandboxState)


def _read_versioned(path: Path, model: type[_State], version: int, what: str, down: str) -> _State:
    """A state file of exactly the version this gpufleet writes; another version's file was made by
    another gpufleet, whose own `sandbox down` must stop what it records."""
    raw = json.loads(path.read_text())
    found = raw.get("version") if isinstance(raw, dict) else None
    if found != version:
        raise ValueError(
            f"{what} version {found!r}, this gpufleet reads version {version}: the sandbox was made by "
            f"another gpufleet version; stop it with that version's {down}"
        )
    return model.model_validate(raw)


def write_state(state: SandboxState, root: Path | None = None) -> Path:
    """Atomically replace the state file (write, fsync, rename)."""
    path = state_path(state.stack, root)
    _atomic_write(path, state.model_dump_json(indent=2))
    return path


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_controller_status(path: Path) -> ControllerStatus:
    return ControllerStatus.model_validate_json(path.read_text())


def write_controller_status(path: Path, status: ControllerStatus) -> None:
    """Atomically replace the controller's status file."""
    status.updated_at = time.time()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(status.model_dump_json(indent=2))
    os.replace(tmp, path)
