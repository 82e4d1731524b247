"""Checkpoint store fault actions."""

from __future__ import annotations

from typing import Any

from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import StorageOutage, StorageSlow
from gpufleet.chaos import engine

__all__ = ["checkpoint_store_outage", "restore_checkpoint_store", "slow_checkpoint_store"]

STORAGE_KINDS = {"storage-outage", "storage-slow"}


def checkpoint_store_outage(
    fault_id: str = "storage-checkpoint-outage", configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Make the checkpoint store unavailable for writes: a read-only bind mount over the sandbox's
    checkpoint directory, in every mount namespace that uses it (writes fail with EROFS, a kernel
    error, not a simulation). Rollback: unmount it everywhere."""
    return engine.inject(configuration, StorageOutage(), fault_id)


def slow_checkpoint_store(
    rate_mbit: float = 10.0,
    fault_id: str = "storage-checkpoint-slow",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Slow the checkpoint store down to `rate_mbit`. Not available on the sandbox (its store is a
    local directory with no throttleable device): the action fails and says so."""
    return engine.inject(configuration, engine.build_injection(StorageSlow, rate_mbit=rate_mbit), fault_id)


def restore_checkpoint_store(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Undo every storage fault still in the ledger."""
    return engine.revert_summary(engine.revert(configuration, STORAGE_KINDS))
