"""What one sweep saw on one node: the typed input of every check (checks.py).

A source (the sandbox's node agents, later DCGM/NVML on a real node) fills it; the checks never
read anything else. `None` means "this source could not read it" and becomes an UNKNOWN reason,
never a healthy default; a field a backend cannot observe at all is listed in `not_observable`
with the reason, and its checks are reported as skipped.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.config.accelerators import AcceleratorModel

Level = Literal["light", "full"]
# The scheduler's view of the node (Slurm sinfo states / a Kubernetes node's cordon and pods).
SchedState = Literal["idle", "allocated", "mixed", "drained", "draining", "down", "unknown"]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuObs(_M):
    index: Annotated[int, Field(ge=0)]
    # XIDs seen since the GPU's last reset / the node's last boot (older ones are history).
    xids: tuple[int, ...] = ()
    # The catalog fault the GPU's health source holds for it (DCGM health watches; the sandbox
    # agent's held fault), None: healthy.
    health_fault: str | None = None
    ecc_correctable_volatile: float = 0.0  # DCGM field 310 (ECC_SBE_VOL_TOTAL)
    ecc_uncorrectable_volatile: float = 0.0  # DCGM field 311 (ECC_DBE_VOL_TOTAL)
    uncorrectable_remapped_rows: float = 0.0  # DCGM field 393
    row_remap_failed: float = 0.0  # DCGM field 395
    row_remap_pending: float = 0.0  # DCGM field 396
    pcie_gen: int | None = None  # current link generation (nvidia-smi pcie.link.gen.current)
    pcie_width: int | None = None  # current link width (nvidia-smi pcie.link.width.current)
    # Lanes the device itself supports (its Link Capabilities, sysfs max_link_width): what the width is
    # judged against when thresholds.yaml pins none for the SKU.
    pcie_width_max: int | None = None


class PortObs(_M):
    name: str
    state: Literal["up", "down", "absent"]
    speed_gbps: float | None = None  # negotiated rate; None: not reported
    carrier_changes: Annotated[int, Field(ge=0)] = 0  # since boot (/sys/class/net/<if>/carrier_changes)


class NodeObservation(_M):
    node: str
    pool: str
    sku: AcceleratorModel
    at: float  # unix seconds
    expected_gpus: Annotated[int, Field(ge=0)]  # the pool's gpusPerNode
    sched_state: SchedState = "unknown"
    gpus: tuple[GpuObs, ...] | None = None  # None: no GPU source could be read
    ports: tuple[PortObs, ...] | None = None  # None: port state could not be read
    expected_port_gbps: float | None = None  # the stack's fabric linkSpeedGbps
    driver_version: str | None = None
    firmware_version: str | None = None
    # Performance results of a full sweep, metric name -> value in the metric's unit (the name
    # carries it: `_gbs` GB/s, `_gbps` Gb/s, `_mbps` Mbit/s); empty on a light sweep.
    perf: dict[str, float] = Field(default_factory=dict)
    job_exclusions: Annotated[int, Field(ge=0)] = 0  # jobs that excluded this node since the last sweep
    unknown: tuple[str, ...] = ()  # why a source could not be read
    not_observable: dict[str, str] = Field(default_factory=dict)  # check group -> why this backend has none
