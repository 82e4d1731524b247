"""What a sandbox run is made of, decided before anything is created: names, addresses, paths.

Pure functions of the stack, a run id and a run directory, so `up` and the unit tests agree and
`down` can be planned from the state file alone.

Naming: every kernel object carries the run id (`gf<runid>...`) so two runs, or a crashed earlier
run, never collide. Linux interface names hold at most 15 characters (IFNAMSIZ 16 including the
terminating NUL, include/uapi/linux/if.h); `check_ifname` enforces it.
Addresses: `<subnetBase>.0.0/24` is the management network (head .1, node i .10+i) and
`<subnetBase>.<10+rail>.0/24` is fabric rail `rail` (node i .10+i). The bridges carry no address,
so these subnets exist only inside the run's namespaces and can repeat across runs.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.config.model import NodePool, SandboxProvisioning, SandboxSpec, StackSpec, duration_seconds
from gpufleet.core.errors import InputError, Problem

IFNAMSIZ = 15  # usable characters of a Linux interface name
RUN_ID_LEN = 6
HEAD_NAME = "head"
AGENT_PORT = 9400  # dcgm-exporter's default port (dcgm-exporter README: `:9400/metrics`)
PROMETHEUS_PORT = 9090  # Prometheus' default, on the head namespace's loopback only
SLURMCTLD_PORT = 6817  # Slurm defaults (slurm.conf(5)); each daemon has its own namespace
SLURMD_PORT = 6818
MGMT_IFNAME = "mgmt0"
MAX_NODES = 240  # host part .10+i must stay below .250 in a /24

_RUN_ID = re.compile(rf"^[0-9a-f]{{{RUN_ID_LEN}}}$")


def new_run_id() -> str:
    return secrets.token_hex(RUN_ID_LEN // 2)


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id must be {RUN_ID_LEN} lowercase hex digits, got {run_id!r}")
    return run_id


def check_ifname(name: str) -> str:
    if not 1 <= len(name) <= IFNAMSIZ or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"invalid Linux interface name {name!r} (1..{IFNAMSIZ} of [A-Za-z0-9_.-])")
    return name


def mgmt_bridge(run_id: str) -> str:
    return check_ifname(f"gf{run_id}m")


def fabric_bridge(run_id: str, rail: int) -> str:
    return check_ifname(f"gf{run_id}f{rail}")


def mgmt_peer(run_id: str, index: int | None) -> str:
    """Root-side veth of a node's management link (index None = the head)."""
    return check_ifname(f"gf{run_id}h" if index is None else f"gf{run_id}m{index}")


def fabric_peer(run_id: str, index: int, rail: int) -> str:
    return check_ifname(f"gf{run_id}f{index}.{rail}")


def fabric_ifname(rail: int) -> str:
    return check_ifname(f"fab{rail}")


def netns_name(run_id: str, node: str) -> str:
    return f"gf-{run_id}-{node}"


@dataclass(frozen=True)
class NodePlan:
    name: str
    role: str  # "compute" | "spare" | "serving" | "head"; serving nodes are outside Slurm
    index: int | None  # position among the nodes; None for the head
    netns: str
    mgmt_peer: str
    mgmt_ip: str
    fabric: tuple[tuple[int, str, str, str], ...] = ()  # (rail, ifname, peer, ip)
    gpus: int = 0
    accelerator: str = ""
    pool: str = ""  # the stack's node pool: the node's Slurm feature (gpufleet inspect --slurm)
    weight: int = 1
    leaf: str | None = None  # the node's leaf group (stack topology.nodesPerLeaf)
    # The pool's software pins (nodePools[].software): the versions the node agent starts at.
    driver_version: str | None = None
    firmware_version: str | None = None

    @property
    def mgmt_cidr(self) -> str:
        return f"{self.mgmt_ip}/24"


@dataclass(frozen=True)
class Layout:
    stack: str
    run_id: str
    base_dir: Path
    rails: int
    head: NodePlan
    nodes: tuple[NodePlan, ...]
    sandbox: SandboxSpec
    scrape_interval_s: float
    evaluation_interval_s: float
    queue: str
    cluster_name: str
    links: tuple[str, ...] = field(default=())
    link_speed_gbps: float = 100.0  # fabric.linkSpeedGbps: the agents' node_infiniband_rate_bytes_per_second
    # remediation.xidOverrides as the agents take it (--xid-overrides): the stack's XID policy
    # decides which XIDs kill the job on the sandbox too.
    xid_overrides_json: str = "{}"
    # Where the training job checkpoints when not in the run folder: a folder of the stack's JuiceFS
    # volume (sandbox.storage.juicefs.training_checkpoint_dir).
    checkpoint_root: Path | None = None
    # Or a bucket prefix of the storage sandbox's object store, named by this location file
    # (core.s3_job_checkpoints.S3Location; sandbox.storage.s3_job, ADR 0070).
    checkpoint_s3: Path | None = None
    # The nodes' bundle hook ships each bundle to the S3 place this file names (fleet.bundle.ship),
    # when the stack's storage sandbox is up.
    bundle_ship: Path | None = None

    # ---- names
    @property
    def bridges(self) -> list[str]:
        return [mgmt_bridge(self.run_id)] + [fabric_bridge(self.run_id, r) for r in range(self.rails)]

    @property
    def namespaces(self) -> list[str]:
        return [self.head.netns] + [n.netns for n in self.nodes]

    @property
    def root_links(self) -> list[str]:
        """Root-side veth ends (deleting one deletes its pair)."""
        out = [self.head.mgmt_peer]
        for n in self.nodes:
            out.append(n.mgmt_peer)
            out.extend(peer for _, _, peer, _ in n.fabric)
        return out

    @property
    def compute_nodes(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.role == "compute"]

    @property
    def spare_nodes(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.role == "spare"]

    @property
    def slurm_nodes(self) -> list[NodePlan]:
        """The nodes Slurm knows: compute and spare (a serving pool's nodes are not Slurm's)."""
        return [n for n in self.nodes if n.role in ("compute", "spare")]

    @property
    def serving_nodes(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.role == "serving"]

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # ---- paths inside the run directory
    def path(self, *parts: str) -> Path:
        return self.base_dir.joinpath(*parts)

    def node_dir(self, node: str) -> Path:
        return self.path("nodes", node)

    def spool_dir(self, node: str) -> Path:
        return self.path("spool", node)  # slurm.conf.j2's SlurmdSpoolDir, %n the node

    def agent_socket(self, node: str) -> Path:
        return self.node_dir(node) / "agent.sock"

    def kernel_log(self, node: str) -> Path:
        return self.node_dir(node) / "kern.log"

    @property
    def token_file(self) -> Path:
        return self.path("agent.token")

    @property
    def munge_socket(self) -> Path:
        return self.path("munge", "munge.socket")

    @property
    def slurm_conf(self) -> Path:
        return self.path("slurm", "slurm.conf")

    @property
    def health_script(self) -> Path:
        return self.path("slurm", "healthcheck.sh")

    @property
    def epilog_script(self) -> Path:
        return self.path("slurm", "epilog.sh")

    @property
    def file_sd_dir(self) -> Path:
        return self.path("prometheus", "file_sd")

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint_root or self.path("checkpoints")

    @property
    def events_file(self) -> Path:
        return self.path("training", "events.jsonl")

    @property
    def hosts_file(self) -> Path:
        return self.path("hosts.json")

    def hosts_map(self) -> dict[str, dict[str, str]]:
        """node -> rendezvous addresses (rail 0 carries the training traffic)."""
        out: dict[str, dict[str, str]] = {}
        for n in self.nodes:
            rail0 = n.fabric[0]
            out[n.name] = {"mgmt_ip": n.mgmt_ip, "fabric_ip": rail0[3], "fabric_ifname": rail0[1]}
        return out


def _host_ip(base: str, third: int, host: int) -> str:
    return f"{base}.{third}.{host}"


def xid_overrides_json(spec: StackSpec) -> str:
    """The stack's remediation.xidOverrides as a node agent takes them (--xid-overrides)."""
    return json.dumps({str(x): o.model_dump(mode="json", by_alias=True)
                       for x, o in spec.remediation.xid_overrides.items()}, sort_keys=True)


def plan_layout(stack_name: str, spec: StackSpec, run_id: str, base_dir: Path) -> Layout:
    """The run's names and addresses. Raises InputError when the stack cannot be a sandbox."""
    check_run_id(run_id)
    problems: list[Problem] = []
    if spec.sandbox is None:
        problems.append(Problem("sandbox", "the stack has no sandbox section"))
    pools = [p for p in spec.node_pools if isinstance(p.provisioning, SandboxProvisioning)]
    if not pools:
        problems.append(Problem("nodePools", "no pool has provisioning kind sandbox"))
    if spec.sandbox is not None and int(spec.sandbox.subnet_base.split(".")[1]) > 255:
        problems.append(Problem("sandbox.subnetBase", f"{spec.sandbox.subnet_base} is not an IPv4 prefix"))
    rails = spec.fabric.rails_per_node
    if 10 + rails > 255:
        problems.append(Problem("fabric.railsPerNode", "too many rails for the sandbox's address plan"))
    total = sum(p.total_nodes for p in pools)
    if total > MAX_NODES:
        problems.append(Problem("nodePools", f"{total} sandbox nodes; the sandbox holds at most {MAX_NODES}"))
    if problems:
        raise InputError(f"stack {stack_name}", problems)
    assert spec.sandbox is not None
    base = spec.sandbox.subnet_base

    compute: list[tuple[str, NodePool]] = []
    spares: list[tuple[str, NodePool]] = []
    serving: list[tuple[str, NodePool]] = []
    leaf: dict[str, str] = {}
    serving_pool = spec.sandbox.serving.pool if spec.sandbox.serving is not None else None
    for pool in pools:
        names = pool.node_names()
        if pool.name == serving_pool:
            serving += [(n, pool) for n in names]
        else:
            compute += [(n, pool) for n in names[: pool.nodes]]
            spares += [(n, pool) for n in names[pool.nodes :]]
        leaf.update({n: pool.leaf_name(i) for i, n in enumerate(names)})
    if HEAD_NAME in {n for n, _ in compute + spares + serving}:
        raise InputError(
            f"stack {stack_name}", [Problem("nodePools", f"node name {HEAD_NAME!r} is reserved")]
        )

    nodes: list[NodePlan] = []
    # Serving nodes come last, so the training nodes' indices and addresses do not depend on them.
    for i, (name, pool) in enumerate(compute + spares + serving):
        role = "compute" if i < len(compute) else "spare" if i < len(compute) + len(spares) else "serving"
        fabric = tuple(
            (r, fabric_ifname(r), fabric_peer(run_id, i, r), _host_ip(base, 10 + r, 10 + i))
            for r in range(rails)
        )
        nodes.append(
            NodePlan(
                name=name,
                role=role,
                index=i,
                netns=netns_name(run_id, name),
                mgmt_peer=mgmt_peer(run_id, i),
                mgmt_ip=_host_ip(base, 0, 10 + i),
                fabric=fabric,
                gpus=pool.gpus_per_node,
                accelerator=pool.accelerator.value,
                pool=pool.name,
                # Slurm allocates the lowest-Weight nodes first (slurm.conf(5) "Weight"): spares last.
                weight=1 if role == "compute" else 100,
                leaf=leaf[name],
                driver_version=pool.software.driver,
                firmware_version=pool.software.firmware,
            )
        )
    head = NodePlan(
        name=HEAD_NAME,
        role="head",
        index=None,
        netns=netns_name(run_id, HEAD_NAME),
        mgmt_peer=mgmt_peer(run_id, None),
        mgmt_ip=_host_ip(base, 0, 1),
    )
    layout = Layout(
        stack=stack_name,
        run_id=run_id,
        base_dir=base_dir,
        rails=rails,
        head=head,
        nodes=tuple(nodes),
        sandbox=spec.sandbox,
        scrape_interval_s=duration_seconds(spec.sandbox.scrape_interval),
        evaluation_interval_s=duration_seconds(spec.monitoring.evaluation_interval),
        queue=spec.scheduler.queues[0].name,
        cluster_name=spec.cluster.name,
        link_speed_gbps=float(spec.fabric.link_speed_gbps),
        xid_overrides_json=xid_overrides_json(spec),
    )
    too_long = socket_path_problems(layout)
    if too_long:
        raise InputError(f"stack {stack_name}", too_long)
    return layout


# A Unix socket's path fits in sun_path's 108 bytes with its NUL (unix(7)). slurmstepd makes the
# longest the sandbox has: <SlurmdSpoolDir>/<node>_<job id>.<step id>, the step id up to 10 digits
# (the batch step is 4294967291). A sandbox's slurmctld numbers jobs from 1 and a run submits far
# fewer than 10,000, so 4 digits are allowed for the job id. Past the limit slurmstepd cannot start
# and every job is cancelled at launch ("Unix socket path ... is too long", seen with a pytest folder
# and the stack sandbox-storage-juicefs).
SUN_PATH_MAX = 107
_STEPD_SOCKET_SUFFIX = len("_1234.4294967291")


def socket_path_problems(layout: Layout) -> list[Problem]:
    """The run folder too deep for the Unix sockets its daemons make, said with the way out."""
    longest = max((n.name for n in layout.nodes), key=len, default="")
    need = len(str(layout.spool_dir(longest))) + 1 + len(longest) + _STEPD_SOCKET_SUFFIX
    if need <= SUN_PATH_MAX:
        return []
    return [
        Problem(
            "sandbox",
            f"the run folder {layout.base_dir} is too deep: slurmstepd's sockets under it would take up "
            f"to {need} bytes, over the {SUN_PATH_MAX} a Unix socket path holds (unix(7)); use a "
            "shorter GPUFLEET_SANDBOX_ROOT or stack name",
        )
    ]
