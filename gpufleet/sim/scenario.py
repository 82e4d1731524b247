"""Scenario files: overrides of the simulator's defaults (scenarios/*.yaml, docs/simulator.md).

Every key is optional; unknown keys are rejected and every problem is reported with its path
(STYLE.md point 7). A configured 0 is kept, never replaced by a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.config.model import SpareMode
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import problems_from_validation, read_yaml
from gpufleet.core.taxonomy import FaultClass, LadderAction

Domain = Literal["node", "rack", "leaf", "cluster"]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class RateOverride(_Model):
    """Replaces the catalog's total rate of one class (its causes keep their proportions)."""

    per_million_gpu_hours: NonNegFloat | None = None
    per_thousand_node_days: NonNegFloat | None = None
    source: str = "scenario"
    # The ladder rung of every fault of this class (replaces the catalog's action; a new class
    # without one gets defaults.CLASS_DEFAULT_ACTION).
    action: LadderAction | None = None

    @model_validator(mode="after")
    def _one_unit(self) -> RateOverride:
        both = self.per_million_gpu_hours is not None and self.per_thousand_node_days is not None
        if both or (not self.has_rate and self.action is None):
            raise ValueError("give one of perMillionGpuHours or perThousandNodeDays, or an action")
        return self

    @property
    def has_rate(self) -> bool:
        return self.per_million_gpu_hours is not None or self.per_thousand_node_days is not None

    def per_gpu_hour(self, gpus_per_node: int) -> float:
        if self.per_million_gpu_hours is not None:
            return self.per_million_gpu_hours / 1e6
        assert self.per_thousand_node_days is not None
        return self.per_thousand_node_days / 1000.0 / 24.0 / gpus_per_node


class LemonSpec(_Model):
    fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    multiplier: Annotated[float, Field(ge=1)] = 1.0
    recurrence_factor: Annotated[float, Field(ge=1)] = 1.0
    recurrence_cap: Annotated[int, Field(ge=0)] = 20


class DetectionSpec(_Model):
    mode: dict[FaultClass, Literal["active", "passive"]] = Field(default_factory=dict)
    active_seconds: dict[FaultClass, NonNegFloat] = Field(default_factory=dict)
    collective_timeout_seconds: PosFloat | None = None


class RestartSpec(_Model):
    reference_gpus: Annotated[int, Field(ge=1)] | None = None
    reference_seconds: NonNegFloat | None = None
    exponent: NonNegFloat | None = None


class CheckpointOverride(_Model):
    interval_minutes: PosFloat | None = None
    write_seconds: NonNegFloat | None = None
    load_seconds: NonNegFloat | None = None
    failure_probability: Annotated[float, Field(ge=0, le=1)] | None = None  # each save, on its own
    retries: Annotated[int, Field(ge=0, le=100)] | None = None  # a failed save retried at once


class StorageOverride(_Model):
    """The checkpoint store: one for the whole job."""

    reference_gpus: Annotated[int, Field(ge=1)] | None = None  # fleet size its rates were seen on
    degraded_factor: Annotated[float, Field(ge=1)] | None = None  # saves and loads this much slower


class AttemptCapsOverride(_Model):
    window_hours: PosFloat | None = None  # count ladder attempts within this window only


class UpgradeSpec(_Model):
    """A rolling drain of every node (driver/firmware upgrade), spares first."""

    start_hours: NonNegFloat = 0.0
    wave_nodes: Annotated[int, Field(ge=1)]
    wave_minutes: PosFloat


class SparesOverride(_Model):
    count: Annotated[int, Field(ge=0)] | None = None
    mode: SpareMode | None = None
    cold_start_seconds: NonNegFloat | None = None


class RepairBin(_Model):
    share: Annotated[float, Field(gt=0, le=1)]
    min_hours: PosFloat
    max_hours: PosFloat

    @model_validator(mode="after")
    def _ordered(self) -> RepairBin:
        if self.min_hours > self.max_hours:
            raise ValueError("minHours must not exceed maxHours")
        return self


class RepairSpec(_Model):
    reset_gpu_seconds: NonNegFloat | None = None
    reboot_node_seconds: NonNegFloat | None = None
    replace: Annotated[list[RepairBin], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _shares(self) -> RepairSpec:
        if self.replace is not None and abs(sum(b.share for b in self.replace) - 1.0) > 1e-6:
            raise ValueError("replace: bin shares must sum to 1")
        return self


class BreakerOverride(_Model):
    max_quarantined_share: Annotated[float, Field(gt=0, le=1)] | None = None
    window_minutes: PosFloat | None = None
    manual_seconds: NonNegFloat | None = None


class Scenario(_Model):
    description: str = ""
    pool: str | None = None
    days: PosFloat | None = None
    rate_scale: PosFloat = 1.0
    rates: dict[FaultClass, RateOverride] = Field(default_factory=dict)
    weibull_shape: dict[FaultClass, PosFloat] = Field(default_factory=dict)
    domains: dict[FaultClass, Domain] = Field(default_factory=dict)
    domain_outage_hours: dict[FaultClass, NonNegFloat] = Field(default_factory=dict)
    isolate_seconds: dict[FaultClass, NonNegFloat] = Field(default_factory=dict)
    lemons: LemonSpec = Field(default_factory=LemonSpec)
    detection: DetectionSpec = Field(default_factory=DetectionSpec)
    restart: RestartSpec = Field(default_factory=RestartSpec)
    checkpoint: CheckpointOverride = Field(default_factory=CheckpointOverride)
    spares: SparesOverride = Field(default_factory=SparesOverride)
    repair: RepairSpec = Field(default_factory=RepairSpec)
    circuit_breaker: BreakerOverride = Field(default_factory=BreakerOverride)
    storage: StorageOverride = Field(default_factory=StorageOverride)
    attempt_caps: AttemptCapsOverride = Field(default_factory=AttemptCapsOverride)
    upgrade: UpgradeSpec | None = None


def parse_scenario(data: object, file: str) -> Scenario:
    if data is None:
        return Scenario()
    if not isinstance(data, dict):
        raise InputError(file, [Problem("(top level)", "a scenario file is a mapping of overrides")])
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise InputError(file, problems_from_validation(e)) from None


def load_scenario(path: Path | str) -> Scenario:
    """Read and validate a scenario YAML file; InputError names the file and every bad path."""
    p = Path(path)
    return parse_scenario(read_yaml(p), str(p))
