"""Scheduler observations over time: schedulability transitions between samples (pure). The
parsing of one `sinfo` sample lives in gpufleet.core.slurm_state."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.core.slurm_state import NodeObs


@dataclass(frozen=True)
class Transition:
    at: float
    node: str
    schedulable: bool
    state: str
    reason: str
    reason_time: float | None


def transitions(samples: list[tuple[float, dict[str, NodeObs]]]) -> list[Transition]:
    """Schedulability changes between successive samples (the first sample is the baseline)."""
    out: list[Transition] = []
    prev: dict[str, bool] = {}
    for i, (t, nodes) in enumerate(samples):
        for name, obs in sorted(nodes.items()):
            was = prev.get(name)
            if i > 0 and was is not None and was != obs.schedulable:
                out.append(Transition(t, name, obs.schedulable, obs.state, obs.reason, obs.reason_time))
            prev[name] = obs.schedulable
    return out
