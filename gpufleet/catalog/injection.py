"""The injection vocabulary: one typed model per injection method, joined on `method`.

A catalog entry's `injection:` is one of these models (validated when the catalog loads, unknown
keys rejected, bounds checked); the chaos engine hands the model to a backend, which plans it if it
declares the model's class among its capabilities (`gpufleet.chaos.backends`). This module is the
only place that says which methods exist and what parameters each takes (ADR 0030).

YAML spelling: `{method: link-flap, rail: 0, periodSeconds: 4, count: 5}` (camelCase keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic.alias_generators import to_camel

# Host signals a node health check reads and a host-signal injection sets, and where each comes from
# on a real node / in the sandbox (the node agent publishes the same series and holds injected
# values: docs/node-agent.md).
HOST_SIGNALS: dict[str, str] = {
    "psu-state": "BMC power-supply sensor state, 0 nominal / 1 warning / 2 critical "
                 "(ipmi_exporter ipmi_sensor_state{type=\"Power Supply\"})",
    "cpu-state": "BMC processor sensor state, 0 / 1 / 2 (ipmi_sensor_state{type=\"Processor\"})",
    "edac-ue": "host memory uncorrectable errors since boot "
               "(EDAC mc*/ue_count; node_edac_uncorrectable_errors_total)",
    "fs-readonly": "1 when the node's local filesystem is mounted read-only "
                   "(/proc/mounts; node_filesystem_readonly)",
    "symbol-errors": "fabric port symbol errors since boot "
                     "(IB counters/symbol_error; node_infiniband_symbol_error_total)",
}
XID_FIELD = 230  # DCGM_FI_DEV_XID_ERRORS: the field whose value is an XID code
MAX_RAIL = 63


class InjectionModel(BaseModel):
    """What every injection method shares. `needs_node`: the injection acts on one node the
    experiment names (a storage outage or a killed rank acts on the cluster's store / job)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)
    needs_node: ClassVar[bool] = True
    method: str

    def params(self) -> dict[str, Any]:
        """The parameters as the catalog spells them (camelCase, unset optionals left out)."""
        out: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, exclude={"method"})
        return out

    def describe(self) -> str:
        """`link-flap rail=0, periodSeconds=4, count=5` (parameters left at their default are not
        shown): for runbooks and `gpufleet catalog show`."""
        given = self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, exclude={"method"})
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in given.items())
        return self.method + (f" {params}" if params else "")


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


Rail = Annotated[int, Field(ge=0, le=MAX_RAIL)]


class DcgmInject(InjectionModel):
    """A DCGM field injection (`dcgmi test --inject` semantics); with `kmsg`, an `NVRM: Xid` kernel
    log line for the XID in `value` (so only for the XID field 230), written `burst` times."""

    method: Literal["dcgm-inject"] = "dcgm-inject"
    field_id: Annotated[int, Field(ge=1, le=65535)]
    value: int | float
    kmsg: bool = False
    burst: Annotated[int, Field(ge=1, le=1000)] = 1

    @model_validator(mode="after")
    def _kmsg_is_an_xid(self) -> DcgmInject:
        if self.kmsg and self.field_id != XID_FIELD:
            raise ValueError(f"kmsg writes an XID line: only with fieldId {XID_FIELD} (XID errors)")
        if self.field_id == XID_FIELD and not (isinstance(self.value, int) and 1 <= self.value <= 255):
            raise ValueError(f"fieldId {XID_FIELD} takes an XID code (an integer 1..255) as value")
        return self


class ExporterInject(InjectionModel):
    """A value written into one GPU's series of its vendor's exporter (AMD's device-metrics-exporter,
    Huawei's npu-exporter), read from then on as `dcgm-inject` does for a DCGM field: the vendors
    have no XIDs, their faults are these health and error series. `metric` must be a series the
    fault's vendor's exporter declares in exporters.yaml (checked when the catalog is generated)."""

    method: Literal["exporter-inject"] = "exporter-inject"
    metric: Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]
    value: int | float


class GpuHang(InjectionModel):
    """One GPU stops completing work while reporting nothing: no XID, no DCGM health or field change
    (its utilization reads 100 %: a kernel that never ends). A process on it blocks; only the
    workload's own watchdog sees it (a serving replica's readiness, a training job's progress).
    Undone by a GPU reset."""

    method: Literal["gpu-hang"] = "gpu-hang"


class NodeCrash(InjectionModel):
    """Every process of the node dies at once (a power loss / kernel crash)."""

    method: Literal["node-crash"] = "node-crash"


class NodeHang(InjectionModel):
    """The node stops answering (its processes frozen). `rebootOnRestore`: the restore reboots it
    (what the hung-node remediation does) instead of thawing it."""

    method: Literal["node-hang"] = "node-hang"
    reboot_on_restore: bool = False


class NodeReboot(InjectionModel):
    """The node goes down and comes back by itself after `downSeconds`."""

    method: Literal["node-reboot"] = "node-reboot"
    down_seconds: Annotated[float, Field(ge=0, le=600)] = 5.0


class LinkDown(InjectionModel):
    """One fabric rail of the node loses its link (a cable pull)."""

    method: Literal["link-down"] = "link-down"
    rail: Rail


class LinkFlap(InjectionModel):
    """`count` cycles of down for period/2, up for period/2."""

    method: Literal["link-flap"] = "link-flap"
    rail: Rail
    period_seconds: Annotated[float, Field(ge=0.2, le=600)]
    count: Annotated[int, Field(ge=1, le=1000)]


class LinkDegrade(InjectionModel):
    """Packet loss and/or a rate cap on one rail (no added latency: netem is not available)."""

    method: Literal["link-degrade"] = "link-degrade"
    rail: Rail
    loss_percent: Annotated[float, Field(gt=0, lt=100)] | None = None
    rate_mbit: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _something(self) -> LinkDegrade:
        if self.loss_percent is None and self.rate_mbit is None:
            raise ValueError("link-degrade needs lossPercent and/or rateMbit")
        return self


class StorageOutage(InjectionModel):
    """The checkpoint store refuses writes."""

    needs_node: ClassVar[bool] = False
    method: Literal["storage-outage"] = "storage-outage"


class StorageSlow(InjectionModel):
    """The checkpoint store's write bandwidth capped at `rateMbit`: a bandwidth throttle (cgroup
    io.max wbps on the store's device, tc tbf on a network store) is what a backend can apply
    without a kernel module; an added per-I/O delay would need dm-delay (ADR 0030)."""

    needs_node: ClassVar[bool] = False
    method: Literal["storage-slow"] = "storage-slow"
    rate_mbit: Annotated[float, Field(gt=0)]


class OsdKill(InjectionModel):
    """SIGKILL one Ceph OSD daemon (a crashed OSD: Ceph marks it down, its PGs degrade, and after
    mon_osd_down_out_interval it is marked out and its data re-replicated). `out`: an OSD lost for
    good, marked out at once, so Ceph re-replicates its data to the other OSDs now."""

    needs_node: ClassVar[bool] = False
    method: Literal["osd-kill"] = "osd-kill"
    osd: Annotated[int, Field(ge=0)]
    out: bool = False


class OsdHang(InjectionModel):
    """SIGSTOP one Ceph OSD daemon (a hung OSD: its peers report it down after the heartbeat
    grace, client I/O to its PGs stalls until then)."""

    needs_node: ClassVar[bool] = False
    method: Literal["osd-hang"] = "osd-hang"
    osd: Annotated[int, Field(ge=0)]


class OsdNearFull(InjectionModel):
    """The cluster's OSDs reported near full (`full`: full, so writes stop while reads go on), by
    lowering Ceph's own nearfull (and backfillfull/full) ratios below their use: the monitor raises
    OSD_NEARFULL / OSD_FULL exactly as for a disk that filled up, with no disk filled."""

    needs_node: ClassVar[bool] = False
    method: Literal["osd-near-full"] = "osd-near-full"
    full: bool = False


class ObjectStoreOutage(InjectionModel):
    """The S3 endpoint (radosgw) is gone: its process killed; Ceph itself stays healthy."""

    needs_node: ClassVar[bool] = False
    method: Literal["object-store-outage"] = "object-store-outage"


class BucketLoss(InjectionModel):
    """The checkpoint bucket is deleted with every object in it (an operator's mistake, a bad
    lifecycle rule, a compromised credential): only the backups remain."""

    needs_node: ClassVar[bool] = False
    method: Literal["bucket-loss"] = "bucket-loss"


class MetadataEngineLoss(InjectionModel):
    """The JuiceFS metadata engine is lost: its Redis killed and its data wiped (a dead machine with
    its disk, a FLUSHALL by mistake): every mount blocks or fails; only the metadata dumps remain."""

    needs_node: ClassVar[bool] = False
    method: Literal["metadata-engine-loss"] = "metadata-engine-loss"


class JuicefsClientKill(InjectionModel):
    """The JuiceFS mount's client processes killed: its FUSE mount stays, answering every call with
    ENOTCONN ("Transport endpoint is not connected") until it is unmounted and mounted again."""

    needs_node: ClassVar[bool] = False
    method: Literal["juicefs-client-kill"] = "juicefs-client-kill"


class SlurmStateLoss(InjectionModel):
    """The Slurm controller loses its state: slurmctld SIGKILLed and its StateSaveLocation gone (a
    controller host lost with its disk, a state directory wiped): only the state backups remain."""

    needs_node: ClassVar[bool] = False
    method: Literal["slurm-state-loss"] = "slurm-state-loss"
    # state-dir: the state directory alone is lost, and the backups on the controller's host remain.
    # controller-host: the host is lost with its disk, so the state directory and the backups kept on
    # it go too. Only the off-host copies in the backup bucket remain (ADR 0069).
    scope: Literal["state-dir", "controller-host"] = "state-dir"


class KillRank(InjectionModel):
    """SIGKILL the training process of one rank (a software crash)."""

    needs_node: ClassVar[bool] = False
    method: Literal["kill-rank"] = "kill-rank"
    rank: Annotated[int, Field(ge=0)]


class HostSignal(InjectionModel):
    """Set (`value`) or add to (`add`) a host signal (HOST_SIGNALS); `effect` crash: the node then
    loses every process (an IERR resets it); sigbus: its training ranks get SIGBUS (a memory UE)."""

    method: Literal["host-signal"] = "host-signal"
    signal: str
    value: float | None = None
    add: float | None = None
    effect: Literal["crash", "sigbus"] | None = None

    @model_validator(mode="after")
    def _one_change(self) -> HostSignal:
        if self.signal not in HOST_SIGNALS:
            raise ValueError(f"unknown host signal {self.signal!r}; known: {', '.join(sorted(HOST_SIGNALS))}")
        if (self.value is None) == (self.add is None):
            raise ValueError("host-signal needs exactly one of value or add")
        return self


class SwitchDown(InjectionModel):
    """The leaf switch of the node loses rail `rail` on every port (correlated: every node behind it)."""

    method: Literal["switch-down"] = "switch-down"
    rail: Rail


class NicRemove(InjectionModel):
    """The node's NIC of rail `rail` disappears (falls off PCIe)."""

    method: Literal["nic-remove"] = "nic-remove"
    rail: Rail


AnyInjection = (
    DcgmInject | ExporterInject | GpuHang | NodeCrash | NodeHang | NodeReboot | LinkDown | LinkFlap
    | LinkDegrade | StorageOutage | StorageSlow | KillRank | HostSignal | SwitchDown | NicRemove | OsdKill
    | OsdHang | OsdNearFull | ObjectStoreOutage | BucketLoss | MetadataEngineLoss | JuicefsClientKill
    | SlurmStateLoss
)
Injection = Annotated[AnyInjection, Field(discriminator="method")]
INJECTION_MODELS: tuple[type[InjectionModel], ...] = (
    DcgmInject, ExporterInject, GpuHang, NodeCrash, NodeHang, NodeReboot, LinkDown, LinkFlap, LinkDegrade,
    StorageOutage, StorageSlow, KillRank, HostSignal, SwitchDown, NicRemove, OsdKill, OsdHang, OsdNearFull,
    ObjectStoreOutage, BucketLoss, MetadataEngineLoss, JuicefsClientKill, SlurmStateLoss,
)
METHODS: dict[str, type[InjectionModel]] = {
    str(m.model_fields["method"].default): m for m in INJECTION_MODELS
}
# Backend name -> the injection models it can plan: declared by the chaos backends
# (gpufleet.chaos.backends.registry.capabilities()) and handed to generation as an input.
Capabilities = Mapping[str, frozenset[type[InjectionModel]]]
_ADAPTER: TypeAdapter[AnyInjection] = TypeAdapter(Injection)


def parse_injection(data: Any) -> AnyInjection:
    """Validate one injection document (raises pydantic.ValidationError)."""
    return _ADAPTER.validate_python(data)


def with_overrides(injection: AnyInjection, overrides: dict[str, Any]) -> AnyInjection:
    """The same method with some parameters replaced (snake_case or camelCase keys), validated
    again; `method` itself cannot be overridden (raises pydantic.ValidationError / ValueError)."""
    if not overrides:
        return injection
    if "method" in overrides and overrides["method"] != injection.method:
        raise ValueError(f"an override cannot change the method ({injection.method})")
    fields = type(injection).model_fields
    spelled = {(fields[k].alias or k) if k in fields else k: v for k, v in overrides.items()}
    return parse_injection({**injection.model_dump(by_alias=True), **spelled})
