"""The resolved inputs of one simulation: every number the model uses, with where it came from.

Built by `gpufleet.sim.resolve` from a stack, the catalog, an optional scenario file and an
optional game-day report; recorded verbatim (`as_dict`) next to every result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from gpufleet.core.taxonomy import FaultClass, LadderAction

Domain = Literal["node", "rack", "leaf", "cluster"]
SpareKind = Literal["warm", "cold"]


@dataclass(frozen=True)
class FaultKind:
    """One stream of faults: a catalog entry (or a scenario's class rate) with its per-node rate."""

    fault_id: str
    fault_class: FaultClass
    cause: str  # the published root-cause row (lost time is reported by it)
    source: str
    per_node_hour: float  # after the catalog's share; fleet events/h = this x all nodes
    action: LadderAction
    escalate_repeats: int | None = None
    escalate_window_hours: float | None = None
    escalate_to: LadderAction | None = None


@dataclass(frozen=True)
class ClassHandling:
    """How one fault class is handled: detection, isolation, restart floor, arrival shape, domain."""

    detect_seconds: float
    detect_source: str
    isolate_seconds: float
    isolate_source: str
    restart_floor_seconds: float = 0.0  # measured small-scale restart (game-day), a lower bound
    restart_floor_source: str = "none"
    weibull_shape: float = 1.0  # 1 = exponential; < 1 infant mortality after (re)entry to service
    domain: Domain = "node"
    domain_outage_hours: float = 4.0
    # Game-day experiments of this class, one (detect, isolate, restart floor) triple each, in
    # seconds: when present, every fault draws one of them (the measured distribution) instead of
    # the fixed detect/isolate/floor above (which then hold the medians, for the record).
    measured: tuple[tuple[float, float, float], ...] = ()


@dataclass(frozen=True)
class UpgradeWave:
    """A rolling drain (driver/firmware upgrade): every node, `wave_nodes` at a time, each wave out
    of service for `wave_seconds`, the first starting at `start_seconds`. Spares are drained first;
    a job node in a wave is swapped out at a checkpoint (a planned restart, no lost work)."""

    start_seconds: float
    wave_nodes: int
    wave_seconds: float


@dataclass(frozen=True)
class SimParams:
    # cluster
    pool: str
    accelerator: str
    job_nodes: int
    gpus_per_node: int
    spares: int
    spare_mode: SpareKind
    nodes_per_rack: int
    nodes_per_leaf: int
    days: float
    # faults
    kinds: tuple[FaultKind, ...]
    handling: dict[FaultClass, ClassHandling]
    lemon_fraction: float = 0.0
    lemon_multiplier: float = 1.0
    recurrence_factor: float = 1.0
    recurrence_cap: int = 20
    # checkpoint and restart
    checkpoint_interval_seconds: float = 1800.0
    checkpoint_write_seconds: float = 30.0
    checkpoint_load_seconds: float = 60.0
    restart_seconds: float = 260.0  # at this job size, checkpoint load included
    restart_source: str = ""
    # spares and repair
    cold_start_seconds: float = 1200.0
    reset_gpu_seconds: float = 300.0
    reboot_node_seconds: float = 1200.0
    repair_bins: tuple[tuple[float, float, float], ...] = ((1.0, 1.0, 24.0),)
    # remediation
    breaker_max_share: float = 0.05
    breaker_window_seconds: float = 300.0
    manual_seconds: float = 3600.0
    # remediation.mode `cordon`: the remediator isolates (cordon + taint) but does not reset, reboot
    # or replace; a human does, so an isolated node's repair starts `manual_seconds` later.
    manual_remediation: bool = False
    cap_reset_gpu: int = 2
    cap_reboot_node: int = 2
    # Attempts counted within this window (None: since the node last entered service new).
    attempt_window_seconds: float | None = None
    # checkpoint store (job-wide): faults of the storage classes arrive at the catalog rate times
    # `store_reference_gpus` (the size of the fleet the rate was observed on), whatever our size
    checkpoint_failure_probability: float = 0.0  # each save fails on its own with this probability
    checkpoint_retries: int = 0  # a save that fails on its own is retried at once, this many times
    store_reference_gpus: int = 16_384
    store_degraded_factor: float = 5.0  # saves and loads take this many times longer when degraded
    upgrade: UpgradeWave | None = None
    collective_timeout_seconds: float = 600.0  # passive detection (for the detection sensitivity)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def total_nodes(self) -> int:
        return self.job_nodes + self.spares

    @property
    def job_gpus(self) -> int:
        return self.job_nodes * self.gpus_per_node

    @property
    def horizon_seconds(self) -> float:
        return self.days * 86400.0

    def per_gpu_hour_total(self) -> float:
        return sum(k.per_node_hour for k in self.kinds) / self.gpus_per_node

    def with_changes(self, **changes: Any) -> SimParams:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record of every input (enums as their values)."""
        out: dict[str, Any] = _plain(dataclasses.asdict(self))
        return out


def _plain(obj: Any) -> Any:
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {(k.value if isinstance(k, Enum) else k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj
