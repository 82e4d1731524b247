"""Kubelet nodes of the Kubernetes sandbox: a real kubelet with containerd and runc that runs real
containers, for the first pool's last N compute nodes instead of kwok (`sandbox up --kubernetes
--kubelet-nodes N`; ADR 0081, docs/kubernetes-sandbox.md "Kubelet nodes").

kwok nodes run no container, so anything judged by what a pod does (a gate's smoke pod, a driver
container that fails to load) needs one of these. The kubelet (its identity `system:node:<name>`, a
client certificate of the run's CA) registers the pool's node with its labels and taints
(choose, split_labels), plus KUBELET_NODE_LABEL as a label and a NoSchedule taint, so that the
training Job's pods stay on kwok nodes; the GPU Operator's DaemonSets tolerate every taint and run
there (gpu_operator.py). The node's GPUs are the sandbox's node agent, advertised to the kubelet by
a device plugin that reads their health from it (device_plugin.py; ADR 0091).

What it must not touch on the host, and how it does not:
- mounts: containerd and the kubelet run in a mount namespace of their own (containerd starts it,
  the kubelet joins it); the folders the kubelet, CNI and containerd write at fixed paths
  (NAMESPACE_TMPFS: the kubelet's device-plugins/ is hard-coded, containerd's shim sockets are
  under /run/containerd/s) are tmpfs there; everything else is under the node's folder in the run
  directory. The namespace goes when its last process
  does, and with it every mount of the node;
- the firewall: `makeIPTablesUtilChains: false`, or the kubelet adds a KUBE-FIREWALL chain to the
  host's INPUT and OUTPUT (kubelet_network_linux.go; seen here before that setting);
- the network: containerd, and so every pod, runs in a network namespace of the node's own (the
  node's network: its loopback and the pods' bridge, CNI's bridge and host-local plugins); a pod with
  hostNetwork shares it. Nothing there routes to the host or beyond. The kubelet stays in the host's
  network namespace, on 127.0.0.1, to reach the API server (it joins the node's mount namespace
  only: it talks to containerd by its socket);
- cgroups: the node's pods live under a cgroup root of its own, `gpufleet-kube-<run>-<node>`, in each
  hierarchy; `down` kills what is left there and removes it.
- no registry: the pods' image (and the pod sandbox's) is the sandbox's Debian root filesystem
  (gpufleet.sandbox.rootfs), imported as NODE_IMAGE with `ctr images import`; a pod names it with
  `imagePullPolicy: Never`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.config.accelerators import all_specs
from gpufleet.core.sandbox_contract import (
    AGENT_HEALTH_FILE,
    KUBELET_AGENT_SOCKET,
    KUBELET_AGENT_TOKEN,
    KubeSandboxState,
    kubelet_node_dir,
)
from gpufleet.core.sandbox_contract import (
    KUBELET_NODE_LABEL as KUBELET_NODE_LABEL,  # re-exported: the sandbox and its tests name it here
)
from gpufleet.sandbox.kube.nodes import KwokNode
from gpufleet.sandbox.kube.pki import LOOPBACK_IP
from gpufleet.sandbox.rootfs import rootfs_key

KUBELET = "kubelet"
CONTAINERD = "containerd"
STREAM_RELAY = "stream-relay"
AGENT = "agent"  # the node's GPUs: gpufleet.sandbox.agent, as on the process sandbox's nodes
DEVICE_PLUGIN = "device-plugin"  # gpufleet.sandbox.kube.device_plugin (ADR 0091)
# The agent's metrics, on the node's own loopback: dcgm-exporter's default port (its DaemonSet's
# containerPort), where a hostNetwork pod of the node would scrape it.
AGENT_METRICS_PORT = 9400
# The pods' image: the sandbox's Debian root filesystem, tagged by its cache key.
NODE_IMAGE = f"localhost/gpufleet/node-base:{rootfs_key()}"
# The pod sandbox's process only holds the pod's namespaces; containerd stops it with SIGKILL.
SANDBOX_ENTRYPOINT = ("/bin/sleep", "infinity")
# Fixed paths the kubelet (its root, and device-plugins/ whatever the root), CNI (its IPAM state and
# cache) and containerd (its shims' sockets, /run/containerd/s, and runc's state) write.
NAMESPACE_TMPFS = ("/var/lib/kubelet", "/var/lib/cni", "/run/containerd")
CNI_NETWORK = "gpufleet-pods"
BRIDGE = "gpufleet0"
CGROUP_FS = Path("/sys/fs/cgroup")
KILL_WAIT_S = 10.0


def choose(nodes: Sequence[KwokNode], count: int) -> list[str]:
    """The planned nodes a kubelet runs instead of kwok (pure): the last `count` compute nodes of the
    first pool (the training job's pool; spares stay kwok's, so the spare pool is untouched)."""
    first = nodes[0].pool if nodes else None
    compute = [n.name for n in nodes if n.pool == first and not n.spare]
    if count > len(compute):
        raise ValueError(f"{count} kubelet node(s) asked, the first pool has {len(compute)} compute node(s)")
    return compute[len(compute) - count:] if count else []


def port_names(names: Sequence[str]) -> tuple[str, ...]:
    """The ports each kubelet node needs, by name (KubeLayout.ports)."""
    return tuple(p for n in names for p in (f"kubelet-{n}", f"kubelet-{n}-healthz", f"kubelet-{n}-stream"))


# What a kubelet may set on its own node in the kubernetes.io and k8s.io namespaces with
# --node-labels; it refuses any other there (k8s.io/kubelet pkg/apis/well_known_labels.go,
# IsKubeletLabel): these keys, and keys in these namespaces or their subdomains.
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
    "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def kubelet_may_set(key: str) -> bool:
    """Whether the kubelet may register its node with this label (pure)."""
    namespace = key.split("/", 1)[0] if "/" in key else ""
    if not namespace.endswith(("kubernetes.io", "k8s.io")) or key in KUBELET_LABELS:
        return True
    return any(namespace == ns or namespace.endswith("." + ns) for ns in KUBELET_LABEL_NAMESPACES)


def split_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(what the kubelet registers with, what the sandbox patches afterwards): a label under
    kubernetes.io or k8s.io the kubelet may not set (a stack's `node-role.kubernetes.io/...`, say)
    goes to the patch. kwok's own `type` label is dropped (pure)."""
    own: dict[str, str] = {}
    patch: dict[str, str] = {}
    for k, v in labels.items():
        if k != "type":
            (own if kubelet_may_set(k) else patch)[k] = v
    return own, patch


def node_taint() -> dict[str, str]:
    return {"key": KUBELET_NODE_LABEL, "value": "true", "effect": "NoSchedule"}


def cgroup_prefix(run_id: str) -> str:
    return f"gpufleet-kube-{run_id}-"


@dataclass(frozen=True)
class KubeletNodeLayout:
    """Where one kubelet node's files are, its ports and its cgroup root."""

    run_id: str
    name: str
    dir: Path  # <run dir>/kn<index>: short, for the sockets' 107-byte path limit (unix(7))
    port: int  # the kubelet's API (TLS)
    healthz_port: int
    # containerd's streaming server (exec, attach, port-forward), on this port of 127.0.0.1 in the
    # node's namespace, and the same port of the host's loopback through the node's stream relay.
    stream_port: int

    @property
    def socket(self) -> Path:
        return self.dir / "ctd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubelet.kubeconfig"

    @property
    def root_dir(self) -> Path:
        """In the namespace's tmpfs: the kubelet's own sockets there (pod-resources/<n>) would pass
        the 107-byte limit under the run directory, and its volume mounts go with the namespace."""
        return Path(NAMESPACE_TMPFS[0])

    @property
    def stream_relay_port_file(self) -> Path:
        return self.dir / "stream-relay.port"  # written once the relay listens

    @property
    def agent_dir(self) -> Path:
        """The node agent's state: gpu-health.json, which the device plugin reads, among it."""
        return self.dir / "agent"

    @property
    def agent_socket(self) -> Path:
        return self.dir / KUBELET_AGENT_SOCKET

    @property
    def agent_token(self) -> Path:
        return self.dir / KUBELET_AGENT_TOKEN

    @property
    def health_file(self) -> Path:
        return self.agent_dir / AGENT_HEALTH_FILE

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def cgroup(self) -> str:
        return f"{cgroup_prefix(self.run_id)}{self.name}"

    @property
    def healthz_url(self) -> str:
        return f"http://{LOOPBACK_IP}:{self.healthz_port}/healthz"


def layout(run_id: str, base_dir: Path, name: str, index: int, ports: Mapping[str, int]) -> KubeletNodeLayout:
    """Node `index` of the run's kubelet nodes; its folder is named by the index (`kn<index>`), not
    by the node's name, which may be long: the sockets in it must stay under 108 bytes."""
    folder = kubelet_node_dir(base_dir, index)
    return KubeletNodeLayout(run_id, name, folder, ports[f"kubelet-{name}"], ports[f"kubelet-{name}-healthz"],
                             ports[f"kubelet-{name}-stream"])


SOCKET_PATH_MAX = 107  # unix(7): sun_path holds 108 bytes with the terminating NUL


def socket_problem(nl: KubeletNodeLayout) -> str | None:
    """Why the node's sockets cannot be bound where the run directory is (None: they can)."""
    longest = str(nl.socket) + ".ttrpc"
    if len(longest) > SOCKET_PATH_MAX:
        return (f"{longest} is {len(longest)} bytes, over the {SOCKET_PATH_MAX} a unix socket path may "
                "hold: use a shorter state root (GPUFLEET_SANDBOX_ROOT) or stack name")
    return None


def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))  # a TOML basic string: JSON's escapes are TOML's


def containerd_config_text(nl: KubeletNodeLayout, runc: Path, cni_bin_dir: Path) -> str:
    """containerd's configuration (version 3, containerd 2.x): its root, state and sockets in the
    node's folder, runc by path, the pinned pod sandbox image, the loopback CNI network (pure)."""
    return "\n".join([
        "version = 3",
        f"root = {_toml_str(nl.dir / 'containerd-root')}",
        f"state = {_toml_str(nl.dir / 'containerd-state')}",
        "[grpc]",
        f"  address = {_toml_str(nl.socket)}",
        "[ttrpc]",
        f"  address = {_toml_str(str(nl.socket) + '.ttrpc')}",
        # The kubelet proxies exec, attach and port-forward to the URL containerd gives it, which
        # names this address; the kubelet dials it from the host's namespace, where the stream
        # relay (stream_relay_argv) listens on the same port. A fixed port, not containerd's
        # default of a random one, so that the relay knows it before containerd starts.
        "[plugins.'io.containerd.grpc.v1.cri']",
        f"  stream_server_address = {_toml_str(LOOPBACK_IP)}",
        f"  stream_server_port = {_toml_str(str(nl.stream_port))}",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {_toml_str(NODE_IMAGE)}",
        "[plugins.'io.containerd.cri.v1.runtime']",
        # No process here may lower its OOM score (the machine's sandboxing refuses it): the pod
        # sandbox's -998 would fail runc's init; restricted, it gets at least containerd's own score.
        "  restrict_oom_score_adj = true",
        # Pod network namespaces under the state folder, not /var/run/netns.
        "  netns_mounts_under_state_dir = true",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
        f"  BinaryName = {_toml_str(runc)}",
        "[plugins.'io.containerd.cri.v1.runtime'.cni]",
        f"  bin_dirs = [{_toml_str(cni_bin_dir)}]",
        f"  conf_dir = {_toml_str(nl.cni_conf_dir)}",
        "",
    ])


def cni_conflist(subnet: str) -> dict[str, Any]:
    """The pods' network (CNI spec 1.0), all inside the node's network namespace: a bridge, a veth
    pair per pod, an address of `subnet` from host-local IPAM; containerd adds the loopback itself.
    No masquerading (no iptables rule): nothing routes out of the node's namespace anyway."""
    ipam = {"type": "host-local", "ranges": [[{"subnet": subnet}]]}
    bridge = {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "ipam": ipam}
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [bridge]}


def pod_subnet(index: int) -> str:
    """Node `index`'s pod addresses: within daemons.POD_CIDR's last /16, which kwok's few pods never
    reach (it hands out addresses from the start of the range)."""
    return f"10.143.{index}.0/24"


def kubelet_config(nl: KubeletNodeLayout, ca_file: Path, cert: Path, key: Path) -> dict[str, Any]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of one node (pure)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # These machines have the cgroup v1 hierarchy; the kubelet refuses it unless told (1.35+).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",  # no systemd here
        "cgroupRoot": f"/{nl.cgroup}",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,  # the host's firewall is not ours (module docstring)
        "address": LOOPBACK_IP,
        "port": nl.port,
        "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK_IP,
        "healthzPort": nl.healthz_port,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        # Only the run's certificates are accepted, and the API server decides what each may do.
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{nl.socket}",
        "imageServiceEndpoint": f"unix://{nl.socket}",
        "podLogsDir": str(nl.pod_logs),
        "resolvConf": "",
        "serializeImagePulls": False,
        # The machine's disk is shared and its fill is not this node's: no eviction (an empty map
        # turns the kubelet's default thresholds off), no image GC.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "nodeStatusReportFrequency": "10s",
        # A container that keeps failing restarts within 1 s instead of backing off to 5 minutes
        # (KubeletCrashLoopBackOffMax, beta and on since 1.35): the GPU Operator calls a driver pod
        # failing after more than 10 restarts (k8s-operator-libs isDriverPodFailing), which the
        # default backoff takes about 30 minutes to reach. The sandbox's time, compressed as kwok's
        # pod-crashloop Stage does for kwok nodes.
        "crashLoopBackOff": {"maxContainerRestartPeriod": "1s"},
    }


def write_node_files(nl: KubeletNodeLayout, runc: Path, cni_bin_dir: Path, ca_file: Path, cert: Path,
                     key: Path, index: int) -> None:
    nl.dir.mkdir(parents=True, exist_ok=True)
    nl.cni_conf_dir.mkdir(exist_ok=True)
    nl.pod_logs.mkdir(exist_ok=True)
    nl.containerd_config.write_text(containerd_config_text(nl, runc, cni_bin_dir))
    conflist = json.dumps(cni_conflist(pod_subnet(index)), indent=2) + "\n"
    (nl.cni_conf_dir / f"10-{CNI_NETWORK}.conflist").write_text(conflist)
    nl.kubelet_config.write_text(yaml.safe_dump(kubelet_config(nl, ca_file, cert, key), sort_keys=True))


def containerd_argv(nl: KubeletNodeLayout, binary: Path) -> list[str]:
    """containerd in new mount and network namespaces (the node's), the first with NAMESPACE_TMPFS
    as tmpfs, the second with its loopback up; `exec` keeps the PID the recorded one. The kubelet
    joins the mount namespace (kubelet_argv)."""
    mounts = " && ".join(f"mkdir -p {d} && mount -t tmpfs -o mode=0755 gpufleet-kubelet {d}"
                         for d in NAMESPACE_TMPFS)
    script = f'ip link set lo up && {mounts} && exec "$0" "$@"'
    return ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script,
            str(binary), "--config", str(nl.containerd_config)]


def stream_relay_argv(nl: KubeletNodeLayout, containerd_pid: int) -> list[str]:
    """The relay from the host's 127.0.0.1:<stream port>, where the kubelet dials containerd's
    streaming server, into the node's namespace (containerd's), where it listens on the same port
    of its own loopback (gpufleet.sandbox.portforward): nothing else of the node is reachable."""
    return [sys.executable, "-m", "gpufleet.sandbox.portforward", "--netns", f"/proc/{containerd_pid}/ns/net",
            "--target-port", str(nl.stream_port), "--listen-port", str(nl.stream_port),
            "--port-file", str(nl.stream_relay_port_file)]


def agent_argv(nl: KubeletNodeLayout, containerd_pid: int, model: str, gpus: int,
               xid_overrides_json: str) -> list[str]:
    """The node's agent (its GPUs), in the node's network namespace: its metrics on the node's own
    loopback; its control socket and state in the node folder."""
    return [
        "nsenter", f"--net=/proc/{containerd_pid}/ns/net", "--",
        sys.executable, "-m", "gpufleet.sandbox.agent",
        "--node", nl.name, "--gpus", str(gpus), "--model", model,
        "--listen", f"{LOOPBACK_IP}:{AGENT_METRICS_PORT}",
        "--control-socket", str(nl.agent_socket), "--token-file", str(nl.agent_token),
        "--state-dir", str(nl.agent_dir), "--kernel-log", str(nl.dir / "kern.log"),
        "--xid-overrides", xid_overrides_json,
    ]


def device_plugin_argv(nl: KubeletNodeLayout, containerd_pid: int, resource: str, gpus: int) -> list[str]:
    """The node's device plugin, in containerd's mount namespace, where the kubelet's folder is."""
    return [
        "nsenter", f"--mount=/proc/{containerd_pid}/ns/mnt", "--", sys.executable, "-m",
        "gpufleet.sandbox.kube.device_plugin", "--node", nl.name, "--resource", resource,
        "--count", str(gpus), "--health-file", str(nl.health_file),
    ]


def kubelet_argv(nl: KubeletNodeLayout, binary: Path, containerd_pid: int,
                 labels: Mapping[str, str], taints: Sequence[Mapping[str, str]] = ()) -> list[str]:
    """The kubelet, in containerd's mount namespace, registering its node with `labels` (those it
    may set: split_labels) and `taints` plus the kubelet-node taint."""
    every = [*taints, node_taint()]
    return [
        "nsenter", f"--mount=/proc/{containerd_pid}/ns/mnt", "--", str(binary),
        f"--config={nl.kubelet_config}",
        f"--kubeconfig={nl.kubeconfig}",
        f"--root-dir={nl.root_dir}",
        f"--hostname-override={nl.name}",
        # The kubelet cannot report its own address: it refuses a loopback node IP ("nodeIP can't be
        # loopback address", logged at each status update) and would take the host's own address
        # without one. The sandbox writes the address into the node's status (node_addresses).
        f"--node-ip={LOOPBACK_IP}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "--register-with-taints=" + ",".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in every),
    ]


def node_addresses() -> list[dict[str, str]]:
    """The node's status addresses: the kubelet's own serving address (kubelet_config's `address`),
    as InternalIP, the one type the API server dials (daemons.apiserver_argv)."""
    return [{"type": "InternalIP", "address": LOOPBACK_IP}]


def python_env_paths() -> list[str]:
    """The host folders this Python environment lives in (the project, for an editable install; the
    virtual environment; the interpreter it was made from): mounted read-only at the same paths, a
    container of NODE_IMAGE runs gpufleet's own programs as the host does."""
    project = Path(__file__).resolve().parents[3]
    return sorted({str(project), sys.prefix, sys.base_prefix})


def smoke_command(node: str, gpus: int, ranks: int, deadline_s: float) -> list[str]:
    """gpufleet's one-step training run as a pod's command (smoke.py --standalone), its verdict in the
    container's termination message."""
    return [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--standalone", "--node", node,
            "--gpus", str(gpus), "--ranks", str(ranks), "--deadline", f"{deadline_s:g}",
            "--termination-log", "/dev/termination-log"]


def perf_command(deadline_s: float) -> list[str]:
    """gpufleet's collective probe (gpufleet.fleet.inspect.collprobe) as a pod's command: 2 ranks,
    gloo on the CPU (a kubelet node has no GPU), its figure in the termination message. 60 timed
    all_reduces of 64 MiB, the best reported: on these shared 2-core hosts the best of 60 spread
    1.70 to 1.94 GB/s over 8 runs, the median of 20 0.78 to 1.27 (docs/fleet-upgrade.md)."""
    return [sys.executable, "-m", "gpufleet.fleet.inspect.collprobe", "--ranks", "2", "--size-mib", "64",
            "--iters", "60", "--deadline", f"{deadline_s:g}", "--termination-log", "/dev/termination-log"]


def bundle_command(vendor: str, fabric: str, deadline_s: float) -> list[str]:
    """gpufleet's node collection (gpufleet.fleet.bundle.nodepod) as a pod's command: the real-node
    table's commands in the node image (its vendor tools are absent, and said so), the archive in
    the pod's log."""
    return [sys.executable, "-m", "gpufleet.fleet.bundle.nodepod", "--vendor", vendor, "--fabric", fabric,
            "--scheduler", "kubernetes", "--deadline", f"{deadline_s:g}",
            "--termination-log", "/dev/termination-log"]


SMOKE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}  # the mounts are read-only


def gpu_resources(capacity: Mapping[str, str]) -> dict[str, str]:
    """The accelerators of a planned node's capacity: its entries named by an accelerator's extended
    resource (config.accelerators)."""
    names = {spec.resource_name for spec in all_specs()}
    return {k: v for k, v in capacity.items() if k in names}


def run_ctr(ctr: Sequence[str], args: Sequence[str], timeout_s: float = 30.0) -> None:
    """One `ctr` command against a node's containerd; RuntimeError naming it when it fails."""
    proc = subprocess.run([*ctr, *args], capture_output=True, text=True, check=False,
                          timeout=max(timeout_s, 1.0))
    if proc.returncode != 0:
        raise RuntimeError(f"`ctr {' '.join(args)}` failed: {proc.stderr.strip()[-300:]}")


def tag_image(ctr: Sequence[str], target: str, source: str = NODE_IMAGE) -> None:
    """Name the node image `target` too in a node's containerd (`ctr images tag`; an existing name
    is replaced), so a pod naming `target` runs it without a registry."""
    run_ctr(ctr, ["images", "tag", "--force", source, target])


def tag_on_nodes(state: KubeSandboxState, target: str, ctr: Path) -> None:
    """Name the node image `target` in every kubelet node's containerd of a running sandbox: how the
    sandbox stages a driver version before a rollout's DaemonSet names it (its images come from no
    registry)."""
    for index, name in enumerate(state.kubelet_nodes):
        nl = layout(state.run_id, Path(state.base_dir), name, index, state.ports)
        tag_image([str(ctr), "--address", str(nl.socket), "--namespace", "k8s.io"], target)


# ----------------------------------------------------------------------------- cgroups (I/O)


def _hierarchies() -> list[Path]:
    """The cgroup hierarchies to make a root in: each v1 controller's, or the v2 root."""
    if (CGROUP_FS / "cgroup.controllers").is_file():
        return [CGROUP_FS]
    # v1: one folder per controller (cpu,cpuacct may be links to one); "unified" is the v2 tree of a
    # hybrid host, where the kubelet's cgroupfs driver makes nothing.
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink()
                  and (p / "cgroup.procs").is_file() and p.name != "unified")


def make_cgroup(name: str) -> None:
    """The node's cgroup root in every hierarchy (the kubelet refuses a cgroupRoot missing in one);
    cpuset needs its CPUs and memory nodes before a task may join."""
    for h in _hierarchies():
        d = h / name
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (h / f).is_file() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())
        if h == CGROUP_FS:  # v2: the controllers the kubelet's QoS cgroups use, for its children
            with contextlib.suppress(OSError):
                (d / "cgroup.subtree_control").write_text("+cpu +memory +pids")


def _cgroup_dirs(prefix: str) -> list[Path]:
    """The run's cgroups in every hierarchy, the hybrid host's "unified" one too (runc makes the
    containers' cgroups there as well)."""
    trees = [*_hierarchies(), *([CGROUP_FS / "unified"] if (CGROUP_FS / "unified").is_dir() else [])]
    return [d for h in trees for d in h.glob(f"{prefix}*") if d.is_dir()]


def _pids_under(root: Path) -> set[int]:
    pids: set[int] = set()
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in procs.read_text().split())
    return pids


def remove_cgroups(run_id: str, wait_s: float = KILL_WAIT_S) -> list[str]:
    """Kill every process left in the run's kubelet node cgroups (the containers: their shims are
    gone by now) and remove the cgroups, deepest first. Returns what could not be removed."""
    dirs = _cgroup_dirs(cgroup_prefix(run_id))
    deadline = time.monotonic() + wait_s
    while True:
        pids = set().union(*(_pids_under(d) for d in dirs)) if dirs else set()
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    left: list[str] = []
    for d in dirs:
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
        try:
            d.rmdir()
        except OSError as e:
            left.append(f"{d}: {e.strerror}")
    return left


def _mounted_in_a_node(path: str) -> bool:
    """Whether a kubelet node's namespace (any run's, any state root's) has a mount at `path`:
    removing the folder would unmount it there (rmdir of another namespace's mount point detaches it,
    Linux >= 3.18)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.path.basename(os.readlink(entry / "exe")) != CONTAINERD:
                continue
            mounts = (entry / "mountinfo").read_text().splitlines()
        except OSError:
            continue
        if any(line.split()[4] == path for line in mounts):
            return True
    return False


def remove_mount_points(paths: Sequence[str] = NAMESPACE_TMPFS) -> None:
    """The folders containerd's namespace made as mount points, on the host: removed when empty (a
    real kubelet's /var/lib/kubelet is not, and stays) and no other kubelet node mounts them."""
    for p in paths:
        if not _mounted_in_a_node(p):
            with contextlib.suppress(OSError):
                Path(p).rmdir()
