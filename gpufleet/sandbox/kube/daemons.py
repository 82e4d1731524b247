"""The Kubernetes sandbox's run: its paths and ports, and the argv of each daemon (pure).

Every daemon listens on 127.0.0.1 only, on a port chosen free at bring-up and recorded in the state
file before the daemon starts (`KubeLayout.ports`), so two runs (and the Slurm sandbox's
Prometheus) never collide and nothing is reachable from another machine. Every connection is TLS
with certificates of the run's CA (pki.py): etcd requires a client certificate, the API server
authenticates clients by certificate or ServiceAccount token and authorizes with Node,RBAC.

Each argv names files inside the run directory, which is unique to the run: `down` finds a daemon
that `up` started but could not record (a crash in between) by that directory in its command line.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.sandbox.kube.pki import LOOPBACK_IP, Pki

# Fake address ranges: nothing routes them, they only have to be valid and not overlap.
SERVICE_CIDR = "10.96.0.0/16"  # --service-cluster-ip-range; its first address is pki.KUBERNETES_SERVICE_IP
POD_CIDR = "10.128.0.0/12"  # kwok's pod addresses: ~1M, enough for any --nodes (kwok's default is a /24)

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KWOK = "kwok"
KUEUE = "kueue"  # Kueue's controller manager (kueue.py)
GPU_OPERATOR = "gpu-operator"  # the NVIDIA GPU Operator, for its driver upgrade controller (gpu_operator.py)
# Start order; `down` stops them in reverse.
DAEMONS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK, KUEUE, GPU_OPERATOR)
KUEUE_HEALTH = "kueue-health"  # its /healthz and /readyz (plain HTTP, as in its Deployment)
KUEUE_WEBHOOK = "kueue-webhook"  # its webhook server (TLS; no webhook configuration points at it)
GPU_OPERATOR_HEALTH = "gpu-operator-health"  # its /healthz and /readyz (plain HTTP)
PORT_NAMES = (
    "etcd-client", "etcd-peer", APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK, KUEUE_HEALTH, KUEUE_WEBHOOK,
    GPU_OPERATOR_HEALTH,
)
# The operator's hard-coded manifest folders (controllers/state_manager.go addState,
# nvidiadriver_controller.go): its NVIDIADriver controller refuses to start without
# manifests/state-driver. The manifests are YAML in the operator's module archive, which the project
# does not take (ADR 0032), so the operator runs with an empty tmpfs over /opt in a mount namespace
# of its own: its ClusterPolicy and NVIDIADriver controllers then deploy nothing, and its upgrade
# controller (k8s-operator-libs pkg/upgrade) runs unchanged on the driver DaemonSet the sandbox
# declares in their place (gpu_operator.py).
GPU_OPERATOR_ASSETS = "/opt/gpu-operator"

# How a node's liveness is kept and judged: kwok renews each node's Lease every quarter of its
# duration (a kubelet's renewInterval), and the node lifecycle controller (kube-controller-manager)
# marks a node NotReady (Unknown) and taints it unreachable once its Lease has not been renewed for
# the grace period, checked every period (Kubernetes' defaults: 50 s and 5 s, a 40 s Lease).
#  - up to LARGE_SANDBOX_NODES: a 40 s Lease (renewed every 10 s) and a 20 s grace: one missed
#    renewal is tolerated and a lost node is NotReady in 10 to 22 s, within the sandbox stack's 30 s
#    node-crash detection budget;
#  - above: an 80 s Lease (renewed every 20 s: 62 writes/s at 1,250 nodes instead of 125) and
#    Kubernetes' 50 s grace. Measured at 1,250 nodes on this 2-core machine at load 12: Leases up to
#    59 s old during the bring-up, up to 25 s after (kwok's renewals lag behind the API server), so
#    a 20 s grace would mark healthy nodes NotReady; a crashed node is NotReady about 50 s after the
#    crash there (scale-10k's node-crash budget: 60 s).
LARGE_SANDBOX_NODES = 200
NODE_MONITOR_PERIOD_S = 2


@dataclass(frozen=True)
class Liveness:
    lease_s: int  # kwok's nodeLeaseDurationSeconds
    grace_s: int  # --node-monitor-grace-period
    period_s: int = NODE_MONITOR_PERIOD_S  # --node-monitor-period

    @property
    def renew_s(self) -> float:
        return self.lease_s / 4


def liveness(nodes: int) -> Liveness:
    """Lease duration and grace period for a sandbox of `nodes` nodes (pure; table above)."""
    return Liveness(40, 20) if nodes <= LARGE_SANDBOX_NODES else Liveness(80, 50)


# Client QPS of the controller manager (default 20/30): at 1,250 nodes the node lifecycle and
# taint controllers write to every node once at start; 20 QPS would take a minute for that alone.
CONTROLLER_QPS = 200
CONTROLLER_BURST = 400


def free_ports(names: tuple[str, ...] = PORT_NAMES) -> dict[str, int]:
    """One free TCP port on 127.0.0.1 per name: all sockets are bound at once (so the kernel gives
    distinct ports) and closed before the daemons bind them."""
    socks: list[socket.socket] = []
    try:
        for _ in names:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK_IP, 0))
            socks.append(s)
        return {name: s.getsockname()[1] for name, s in zip(names, socks, strict=True)}
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class KubeLayout:
    """Where a run's files are and which ports its daemons use."""

    stack: str
    run_id: str
    base_dir: Path
    ports: Mapping[str, int]

    def __post_init__(self) -> None:
        missing = sorted(set(PORT_NAMES) - set(self.ports))
        if missing:
            raise ValueError(f"no port for {', '.join(missing)}")

    @property
    def pki(self) -> Pki:
        return Pki(self.base_dir / "pki")

    @property
    def etcd_dir(self) -> Path:
        return self.base_dir / "etcd"

    def log(self, daemon: str) -> Path:
        return self.base_dir / "logs" / f"{daemon}.log"

    def kubeconfig(self, who: str) -> Path:
        return self.base_dir / "kubeconfigs" / f"{who}.kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.base_dir / "kwok" / "kwok.yaml"

    @property
    def kueue_dir(self) -> Path:
        return self.base_dir / "kueue"

    @property
    def kueue_config(self) -> Path:
        return self.kueue_dir / "config.yaml"

    @property
    def kueue_cert_dir(self) -> Path:
        """Where the sandbox puts the webhook certificate from Kueue's Secret, as a kubelet mounts it."""
        return self.kueue_dir / "certs"

    @property
    def api_url(self) -> str:
        return f"https://{LOOPBACK_IP}:{self.ports[APISERVER]}"

    @property
    def etcd_url(self) -> str:
        return f"https://{LOOPBACK_IP}:{self.ports['etcd-client']}"

    def healthz_url(self, daemon: str) -> str:
        """Where readiness is asked: the API server's /readyz, the others' /healthz."""
        if daemon == ETCD:
            return f"{self.etcd_url}/health"
        if daemon == APISERVER:
            return f"{self.api_url}/readyz"
        if daemon == KUEUE:  # ready once its certificates are there and its controllers set up
            return f"http://{LOOPBACK_IP}:{self.ports[KUEUE_HEALTH]}/readyz"
        if daemon == GPU_OPERATOR:
            return f"http://{LOOPBACK_IP}:{self.ports[GPU_OPERATOR_HEALTH]}/readyz"
        scheme = "http" if daemon == KWOK else "https"  # kwok's server has no certificate here
        return f"{scheme}://{LOOPBACK_IP}:{self.ports[daemon]}/healthz"

    @property
    def service_account_issuer(self) -> str:
        return self.api_url


def etcd_argv(binary: Path, lay: KubeLayout) -> list[str]:
    pki, peer = lay.pki, f"https://{LOOPBACK_IP}:{lay.ports['etcd-peer']}"
    name = f"gpufleet-{lay.run_id}"
    return [
        str(binary),
        f"--name={name}",
        f"--data-dir={lay.etcd_dir}",
        f"--listen-client-urls={lay.etcd_url}",
        f"--advertise-client-urls={lay.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
        "--initial-cluster-state=new",
        f"--cert-file={pki.cert('etcd-server')}",
        f"--key-file={pki.key('etcd-server')}",
        f"--trusted-ca-file={pki.ca_cert}",
        "--client-cert-auth=true",
        f"--peer-cert-file={pki.cert('etcd-server')}",
        f"--peer-key-file={pki.key('etcd-server')}",
        f"--peer-trusted-ca-file={pki.ca_cert}",
        "--peer-client-cert-auth=true",
        # The data is thrown away by `down`; fsync would only slow the 1,250-node bring-up.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_argv(binary: Path, lay: KubeLayout) -> list[str]:
    pki = lay.pki
    return [
        str(binary),
        f"--etcd-servers={lay.etcd_url}",
        f"--etcd-cafile={pki.ca_cert}",
        f"--etcd-certfile={pki.cert('apiserver-etcd-client')}",
        f"--etcd-keyfile={pki.key('apiserver-etcd-client')}",
        f"--bind-address={LOOPBACK_IP}",
        f"--advertise-address={LOOPBACK_IP}",
        f"--secure-port={lay.ports[APISERVER]}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_cert}",
        # Logs and exec of pods on kubelet nodes: the API server dials the node's kubelet as a client
        # of the run's CA and checks the kubelet's serving certificate against it. InternalIP only:
        # a kubelet node's address is 127.0.0.1 (cluster._start_kubelet_nodes); the Hostname type
        # would send the node's name to the machine's DNS resolver, outside the sandbox.
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        "--kubelet-preferred-address-types=InternalIP",
        "--anonymous-auth=false",
        "--authorization-mode=Node,RBAC",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-account-issuer={lay.service_account_issuer}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Fault pods of the chaos backend are privileged (hostPID, /dev/kmsg).
        "--allow-privileged=true",
        # The `kubernetes` Service's Endpoints may not hold a loopback address (validation
        # rejects 127.0.0.0/8): without this the reconciler logs an error every 10 s.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]


def controller_manager_argv(binary: Path, lay: KubeLayout, live: Liveness | None = None) -> list[str]:
    live = live or liveness(1)
    pki, kc = lay.pki, lay.kubeconfig("controller-manager")
    return [
        str(binary),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        f"--bind-address={LOOPBACK_IP}",
        f"--secure-port={lay.ports[CONTROLLER_MANAGER]}",
        f"--tls-cert-file={pki.cert('controller-manager-serving')}",
        f"--tls-private-key-file={pki.key('controller-manager-serving')}",
        f"--client-ca-file={pki.ca_cert}",
        # Each controller acts as its own ServiceAccount (kube-system/<controller>), with the
        # bootstrap policy's role for it, instead of the controller manager's broad identity.
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}",  # published in every namespace as kube-root-ca.crt
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--leader-elect=false",  # one instance
        f"--node-monitor-grace-period={live.grace_s}s",
        f"--node-monitor-period={live.period_s}s",
        f"--kube-api-qps={CONTROLLER_QPS}",
        f"--kube-api-burst={CONTROLLER_BURST}",
        "--profiling=false",
    ]


def scheduler_argv(binary: Path, lay: KubeLayout) -> list[str]:
    pki, kc = lay.pki, lay.kubeconfig("scheduler")
    return [
        str(binary),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        f"--bind-address={LOOPBACK_IP}",
        f"--secure-port={lay.ports[SCHEDULER]}",
        f"--tls-cert-file={pki.cert('scheduler-serving')}",
        f"--tls-private-key-file={pki.key('scheduler-serving')}",
        f"--client-ca-file={pki.ca_cert}",
        "--leader-elect=false",
    ]


def kwok_argv(binary: Path, lay: KubeLayout, node_selector: str) -> list[str]:
    """kwok acts for the nodes carrying `node_selector` (an annotation `key=value`) only."""
    return [
        str(binary),
        f"--kubeconfig={lay.kubeconfig('kwok')}",
        f"--config={lay.kwok_config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={node_selector}",
        f"--server-address={LOOPBACK_IP}:{lay.ports[KWOK]}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={LOOPBACK_IP}",
    ]


def kueue_argv(binary: Path, lay: KubeLayout) -> list[str]:
    """Kueue's manager with its configuration file (kueue.configuration) and its own identity."""
    return [str(binary), f"--config={lay.kueue_config}", f"--kubeconfig={lay.kubeconfig('kueue')}"]


def gpu_operator_argv(binary: Path, lay: KubeLayout, *, as_root: bool) -> list[str]:
    """The GPU Operator under its own identity, in a mount namespace whose /opt is an empty tmpfs
    holding only the folders it insists on (GPU_OPERATOR_ASSETS). Not root: a user namespace maps
    the caller to root there, which is all the mount needs. `exec` keeps the PID the recorded one."""
    wrap = ["unshare", "--mount", "--propagation", "private"] + ([] if as_root else ["--map-root-user"])
    script = (f"mount -t tmpfs -o size=1m,mode=0755 gpufleet-gpu-operator /opt"
              f" && mkdir -p {GPU_OPERATOR_ASSETS}/manifests/state-driver && exec \"$0\" \"$@\"")
    return [
        *wrap, "sh", "-c", script, str(binary),
        f"--kubeconfig={lay.kubeconfig(GPU_OPERATOR)}",
        f"--health-probe-bind-address={LOOPBACK_IP}:{lay.ports[GPU_OPERATOR_HEALTH]}",
        "--metrics-bind-address=0",  # 0: no metrics server
        "--leader-elect=false",
    ]
