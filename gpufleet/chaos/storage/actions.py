"""Storage fault actions: the checkpoint store of the Slurm sandbox, and the storage sandbox's real
Ceph cluster (backend `storage`: OSDs, radosgw, the checkpoint bucket; docs/storage.md)."""

from __future__ import annotations

from typing import Any

from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import (
    BucketLoss,
    JuicefsClientKill,
    MetadataEngineLoss,
    ObjectStoreOutage,
    OsdHang,
    OsdKill,
    OsdNearFull,
    StorageOutage,
    StorageSlow,
)
from gpufleet.chaos import engine

__all__ = [
    "checkpoint_bucket_loss",
    "checkpoint_store_outage",
    "juicefs_client_kill",
    "metadata_engine_loss",
    "object_store_outage",
    "osd_hang",
    "osd_kill",
    "osd_near_full",
    "osd_thrash",
    "restore_checkpoint_store",
    "restore_storage",
    "slow_checkpoint_store",
]

STORAGE_KINDS = {"storage-outage", "storage-slow"}
CEPH_KINDS = {
    "osd-kill",
    "osd-hang",
    "osd-near-full",
    "object-store-outage",
    "bucket-loss",
    "metadata-engine-loss",
    "juicefs-client-kill",
    "osd-thrash",
}


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


def osd_kill(
    osd: int,
    out: bool = False,
    fault_id: str = "storage-ceph-osd-down",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """SIGKILL Ceph's osd.<osd> (refused when it would leave fewer than min_size copies of some
    placement group up); `out`: also mark it out (lost for good: Ceph re-replicates its data now).
    Rollback: start it again from its recorded Launch recipe (and mark it in)."""
    return engine.inject(configuration, engine.build_injection(OsdKill, osd=osd, out=out), fault_id)


def osd_hang(
    osd: int,
    fault_id: str = "storage-ceph-osd-down",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """SIGSTOP Ceph's osd.<osd> (same guard as osd_kill): its peers report it down after the
    heartbeat grace, the same alert as a crashed OSD. Rollback: SIGCONT."""
    return engine.inject(configuration, engine.build_injection(OsdHang, osd=osd), fault_id)


def osd_near_full(
    full: bool = False,
    fault_id: str | None = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Ceph's OSDs reported near full (`full`: full, writes stop) by lowering its full ratios below
    their use. Rollback: Ceph's default ratios."""
    fid = fault_id or ("storage-ceph-osd-full" if full else "storage-ceph-osd-near-full")
    return engine.inject(configuration, engine.build_injection(OsdNearFull, full=full), fid)


def object_store_outage(
    fault_id: str = "storage-object-store-outage",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Kill radosgw: the S3 endpoint stops answering. Rollback: start it again from its recipe."""
    return engine.inject(configuration, ObjectStoreOutage(), fault_id)


def checkpoint_bucket_loss(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Delete the checkpoint bucket and every object in it. Rollback (and the drill's restore):
    recreate it and restore every backed-up checkpoint, each verified against its manifest."""
    return engine.inject(configuration, BucketLoss(), None)


def metadata_engine_loss(
    fault_id: str = "storage-metadata-loss", configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Kill the JuiceFS metadata engine (Redis) and wipe its data. Rollback (and drill
    metadata-engine-lost's restore): Redis started again, the newest verified `juicefs dump` of the
    backup bucket loaded, the volume mounted again, every checkpoint on it verified."""
    return engine.inject(configuration, MetadataEngineLoss(), fault_id)


def juicefs_client_kill(
    fault_id: str = "storage-juicefs-client-down",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Kill the JuiceFS mount's client (its watchdog and FUSE process): every access to the mount
    fails with "Transport endpoint is not connected". Rollback: unmount and mount again."""
    return engine.inject(configuration, JuicefsClientKill(), fault_id)


def restore_storage(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Undo every Ceph and JuiceFS fault still in the ledger (restart daemons, thaw, ratios back,
    restore the checkpoint bucket from its backups, restore the metadata engine, mount again)."""
    return engine.revert_summary(engine.revert(configuration, CEPH_KINDS))


def osd_thrash(
    minutes: float = 2.0,
    max_changes: int = 20,
    seed: int | None = None,
    min_pause_seconds: float = 1.0,
    max_pause_seconds: float = 5.0,
    settle_timeout_seconds: float = 120.0,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Thrash the storage sandbox's OSDs after Ceph's own OSD thrasher, for `minutes` and at most
    `max_changes` changes: OSDs marked out, killed (marked down, and out when enough stay in), marked
    down, marked in and revived at random (`seed`; random when omitted, reported), never more down
    than pool size - min_size nor fewer in than size. Each change is written to the fault ledger
    before it is applied, then every PG awaited active (and active+clean where possible). Meanwhile
    an S3 oracle writes objects and checks every read by sha256, and the checkpoint writer saves.
    At the end every OSD is revived and marked in. Returns the report (time to clean as median, p90
    and max; oracle reads, writes, mismatches; S3 errors accounted for and not; checkpoints lost and
    corrupt; outcome PASS or FAIL), which probe thrash_within_limits judges. Rollback:
    restore_storage (every OSD started and marked in)."""
    from gpufleet.chaos.storage.thrash import ThrashSettings, thrash

    settings = ThrashSettings(
        minutes=minutes,
        max_changes=max_changes,
        seed=seed,
        min_pause_s=min_pause_seconds,
        max_pause_s=max_pause_seconds,
        settle_timeout_s=settle_timeout_seconds,
    )
    return thrash(configuration or {}, settings)
