"""What every backend offers: observations of the cluster and fault plans.

A Plan says what a fault is, which rollback undoes it (a name + JSON-able arguments, so that
`gpufleet chaos revert` can undo it with nothing but the ledger), and how to apply it. The engine
writes the plan to the ledger BEFORE calling `apply`.

Every backend declares `capabilities`: the injection models (gpufleet.catalog.injection) it can
plan, and for some of the others why not (`not_offered`). `Backend.plan` refuses anything else with
an InvalidActivity naming what the backend can do, then dispatches on the model's type;
tests/unit/chaos/test_backend_conformance.py builds every catalog fault on every backend that
declares it and checks the plans alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, assert_never

from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog.injection import (
    AnyInjection,
    BucketLoss,
    DcgmInject,
    ExporterInject,
    GpuHang,
    HostSignal,
    InjectionModel,
    JuicefsClientKill,
    KillRank,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    MetadataEngineLoss,
    NicRemove,
    NodeCrash,
    NodeHang,
    NodeReboot,
    ObjectStoreOutage,
    OsdHang,
    OsdKill,
    OsdNearFull,
    SlurmStateLoss,
    StorageOutage,
    StorageSlow,
    SwitchDown,
)
from gpufleet.chaos.ledger import Ledger, Rollback
from gpufleet.core.slurm_state import NodeObs


@dataclass
class Plan:
    kind: str  # catalog injection method
    target: dict[str, Any]
    params: dict[str, Any]
    rollback: Rollback
    apply: Callable[[], dict[str, Any]]
    summary: str
    nodes_down: set[str] = field(default_factory=set)  # nodes this fault takes out of service
    # Called after apply with the ledger id, for faults that end themselves (flap, reboot).
    after: Callable[[str, Ledger], None] | None = None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    role: str  # compute | spare | serving | head


@dataclass(frozen=True)
class ServingTarget:
    """The serving workload a backend runs: where its load balancer answers, where to reach it from,
    and which nodes carry its replicas."""

    url: str  # the balancer's frontend, http://HOST:PORT
    stats_url: str | None  # HAProxy's `/stats;csv` (each replica's state), where the backend knows it
    netns: str | None  # the network namespace both are reached from (the sandbox's head); None: here
    replicas: tuple[str, ...]  # the replicas' node names, in order (`@serving:<i>`)


@dataclass(frozen=True)
class TrainingPods:
    """The training job's pods as the API server shows them (a backend whose workload is pods)."""

    job: str  # namespace/name
    wanted: int  # the Job's parallelism
    running: int  # Running, Ready and not being deleted
    pending: int
    nodes: tuple[str, ...]  # nodes of the running pods, by completion index

    @property
    def complete(self) -> bool:
        return self.running >= self.wanted


class Backend:
    name = "base"

    # ------------------------------------------------------------ observations
    def nodes(self) -> list[NodeInfo]:
        raise NotImplementedError

    def node_states(self) -> dict[str, NodeObs]:
        raise NotImplementedError

    def prometheus_url(self) -> str | None:
        return None

    def job_nodes(self) -> list[str]:
        """Nodes the training job runs on now, in Slurm's order (empty when it is not running)."""
        return []

    def workload_events(self) -> str | None:
        """Path of the training events JSONL, where the backend has one."""
        return None

    def training_pods(self) -> TrainingPods | None:
        """The training job's pods, where the backend's workload is pods (Kubernetes); None where it
        is not or the backend names no training job."""
        return None

    def dead_daemons(self) -> list[str]:
        """Cluster daemons the backend knows of that are not running (steady-state check)."""
        return []

    def training_incarnation(self) -> int | None:
        """The incarnation the platform runs now (the `restart` its ranks' events carry), where it
        says; None where it does not (the newest incarnation in the events is taken)."""
        return None

    def training_note(self) -> str:
        """Why the training job is not running, when the platform says (e.g. its auto-resume
        controller spent its restart budget); empty when it says nothing."""
        return ""

    def serving(self) -> ServingTarget | None:
        """The serving workload this backend runs, where it runs one; None where it does not (the
        experiment's `gpufleet_serving_url` then names the balancer the load drives)."""
        return None

    # ------------------------------------------------------------ healing (steady.py)
    def restart_dead_daemons(self) -> list[str]:
        raise ActivityFailed(f"backend {self.name} cannot restart daemons: heal the cluster by hand")

    def resume_node(self, node: str) -> None:
        raise ActivityFailed(f"backend {self.name} cannot resume node {node}: resume it by hand")

    def reset_restart_budget(self) -> None:
        """Before an experiment: the platform's restart budget starts afresh (a deliberately injected
        fault is not a crash loop). A backend without such a budget does nothing."""

    def resume_training(self) -> str:
        raise ActivityFailed(f"backend {self.name} cannot resubmit the training job: resubmit it by hand")

    # ------------------------------------------------------------ faults
    # The injection models this backend can plan (its plan_* method for each is implemented).
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset()
    # Why some of the others are not offered, said by the refusal.
    not_offered: ClassVar[Mapping[type[InjectionModel], str]] = {}

    @classmethod
    def can_inject(cls, injection: InjectionModel) -> bool:
        return type(injection) in cls.capabilities

    @classmethod
    def refusal(cls, injection: InjectionModel) -> str:
        """Why this backend does not inject `injection` (empty when it does)."""
        if cls.can_inject(injection):
            return ""
        why = cls.not_offered.get(type(injection))
        can = ", ".join(sorted(str(m.model_fields["method"].default) for m in cls.capabilities)) or "nothing"
        return (f"backend {cls.name} cannot inject {injection.method}" + (f": {why}" if why else "")
                + f" (it can inject: {can})")

    def plan(self, injection: AnyInjection, node: str = "", gpu: int = 0) -> Plan:
        """The plan of `injection` on `node` (GPU `gpu`), dispatched on the model's type."""
        if not self.can_inject(injection):
            raise InvalidActivity(self.refusal(injection))
        if injection.needs_node and not node:
            raise InvalidActivity(f"{injection.method} needs a node")
        match injection:
            case DcgmInject():
                return self.plan_dcgm_inject(node, gpu, injection)
            case ExporterInject():
                return self.plan_exporter_inject(node, gpu, injection)
            case GpuHang():
                return self.plan_gpu_hang(node, gpu, injection)
            case NodeCrash():
                return self.plan_node_crash(node)
            case NodeHang():
                return self.plan_node_hang(node, injection)
            case NodeReboot():
                return self.plan_node_reboot(node, injection)
            case LinkDown():
                return self.plan_link_down(node, injection)
            case LinkFlap():
                return self.plan_link_flap(node, injection)
            case LinkDegrade():
                return self.plan_link_degrade(node, injection)
            case StorageOutage():
                return self.plan_storage_outage()
            case StorageSlow():
                return self.plan_storage_slow(injection)
            case KillRank():
                return self.plan_kill_rank(injection)
            case HostSignal():
                return self.plan_host_signal(node, injection)
            case SwitchDown():
                return self.plan_switch_down(node, injection)
            case NicRemove():
                return self.plan_nic_remove(node, injection)
            case OsdKill():
                return self.plan_osd_kill(injection)
            case OsdHang():
                return self.plan_osd_hang(injection)
            case OsdNearFull():
                return self.plan_osd_near_full(injection)
            case ObjectStoreOutage():
                return self.plan_object_store_outage()
            case BucketLoss():
                return self.plan_bucket_loss()
            case MetadataEngineLoss():
                return self.plan_metadata_engine_loss()
            case JuicefsClientKill():
                return self.plan_juicefs_client_kill()
            case SlurmStateLoss():
                return self.plan_slurm_state_loss(injection)
            case _:
                assert_never(injection)

    def _unsupported(self, method: str, why: str = "") -> InvalidActivity:
        # Reached only when a backend declares a capability without implementing its plan_* method.
        return InvalidActivity(f"backend {self.name} declares {method} but has no planner for it"
                               + (f": {why}" if why else ""))

    def plan_dcgm_inject(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        raise self._unsupported("dcgm-inject")

    def plan_exporter_inject(self, node: str, gpu: int, inj: ExporterInject) -> Plan:
        raise self._unsupported("exporter-inject")

    def plan_gpu_hang(self, node: str, gpu: int, inj: GpuHang) -> Plan:
        raise self._unsupported("gpu-hang")

    # ------------------------------------------------------------ planned operations
    REPLICA_RESTART: ClassVar[str] = "replica-restart"  # the ledger kind of one replica's restart

    def plan_replica_restart(self, replica: str, drain_timeout_s: float, ready_timeout_s: float) -> Plan:
        """Restart one serving replica without losing a request: drain it in the balancer, wait for
        its requests to finish, restart it, wait until it is ready, put it back. Not a fault (no
        catalog entry): a planned operation, recorded in the ledger all the same, so a run cut off
        mid-restart leaves no replica stopped or drained (`gpufleet chaos revert`)."""
        raise InvalidActivity(f"backend {self.name} cannot restart serving replicas")

    def plan_node_crash(self, node: str) -> Plan:
        raise self._unsupported("node-crash")

    def plan_node_hang(self, node: str, inj: NodeHang) -> Plan:
        raise self._unsupported("node-hang")

    def plan_node_reboot(self, node: str, inj: NodeReboot) -> Plan:
        raise self._unsupported("node-reboot")

    def plan_link_down(self, node: str, inj: LinkDown) -> Plan:
        raise self._unsupported("link-down")

    def plan_link_flap(self, node: str, inj: LinkFlap) -> Plan:
        raise self._unsupported("link-flap")

    def plan_link_degrade(self, node: str, inj: LinkDegrade) -> Plan:
        raise self._unsupported("link-degrade")

    def plan_storage_outage(self) -> Plan:
        raise self._unsupported("storage-outage")

    def plan_storage_slow(self, inj: StorageSlow) -> Plan:
        raise self._unsupported("storage-slow")

    def plan_kill_rank(self, inj: KillRank) -> Plan:
        raise self._unsupported("kill-rank")

    def plan_host_signal(self, node: str, inj: HostSignal) -> Plan:
        raise self._unsupported("host-signal")

    def plan_switch_down(self, node: str, inj: SwitchDown) -> Plan:
        raise self._unsupported("switch-down")

    def plan_nic_remove(self, node: str, inj: NicRemove) -> Plan:
        raise self._unsupported("nic-remove")

    def plan_osd_kill(self, inj: OsdKill) -> Plan:
        raise self._unsupported("osd-kill")

    def plan_osd_hang(self, inj: OsdHang) -> Plan:
        raise self._unsupported("osd-hang")

    def plan_osd_near_full(self, inj: OsdNearFull) -> Plan:
        raise self._unsupported("osd-near-full")

    def plan_object_store_outage(self) -> Plan:
        raise self._unsupported("object-store-outage")

    def plan_bucket_loss(self) -> Plan:
        raise self._unsupported("bucket-loss")

    def plan_metadata_engine_loss(self) -> Plan:
        raise self._unsupported("metadata-engine-loss")

    def plan_juicefs_client_kill(self) -> Plan:
        raise self._unsupported("juicefs-client-kill")

    def plan_slurm_state_loss(self, inj: SlurmStateLoss) -> Plan:
        raise self._unsupported("slurm-state-loss")


def tbf_argv(ifname: str, rate_mbit: float) -> list[str]:
    """`tc` argv capping `ifname` at `rate_mbit` with a token bucket (the sandbox and Slurm backends
    share it). burst >= rate/HZ (tc-tbf(8)); 32 kbit is enough up to ~250 Mbit/s at HZ=1000."""
    burst_kbit = max(32, int(rate_mbit * 1000 / 250))
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        f"{rate_mbit:g}mbit",
        "burst",
        f"{burst_kbit}kbit",
        "latency",
        "400ms",
    ]


def nft_table(ifname: str) -> str:
    """The nftables table a link-degrade fault owns on `ifname` (one name for every backend, so a
    revert by either finds it)."""
    return f"gpufleet_chaos_{ifname}".replace("-", "_").replace(".", "_")


def nft_loss_argv(table: str, ifname: str, loss_percent: float) -> list[str]:
    """`nft` argv dropping `loss_percent` % of the packets arriving on `ifname`: numgen random
    mod 1000 < p*10 (nft(8) "NUMGEN EXPRESSION"); netem is not available on this kernel. nft 1.0.6
    (Debian 12) wants the `;` after the chain's `}` on one command line."""
    per_mille = round(loss_percent * 10)
    return [
        "nft",
        f"table inet {table} {{ chain input {{ type filter hook input priority -10; "
        f'iifname "{ifname}" numgen random mod 1000 < {per_mille} drop; }}; }}',
    ]


def nft_delete_argv(table: str) -> list[str]:
    return ["nft", "delete", "table", "inet", table]
