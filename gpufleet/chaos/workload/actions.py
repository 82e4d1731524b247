"""Workload fault actions."""

from __future__ import annotations

from typing import Any

from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import KillRank
from gpufleet.chaos import engine

__all__ = ["kill_rank"]


def kill_rank(
    rank: int = 0, fault_id: str | None = None, configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """SIGKILL the training process of rank `rank` (found by its RANK environment variable in the
    sandbox's node namespaces). The workload must notice and restart from its checkpoint; there is
    nothing to roll back."""
    return engine.inject(configuration, engine.build_injection(KillRank, rank=rank), fault_id)
