"""The storage backend: faults in the storage sandbox's real Ceph cluster (docs/storage.md).

It reaches the cluster only through the storage sandbox's state file (core.storage_contract): the
recorded daemons with their Launch recipes, the `ceph` admin command it names, the S3 endpoint and
buckets. Every plan names a rollback in gpufleet.chaos.rollbacks with JSON arguments, so
`gpufleet chaos revert` undoes it from the ledger alone; OSD faults pass the OSD blast-radius guard
(guard.osd_blast_radius) first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Any, ClassVar

from botocore.exceptions import ClientError
from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog.injection import (
    BucketLoss,
    InjectionModel,
    JuicefsClientKill,
    MetadataEngineLoss,
    ObjectStoreOutage,
    OsdHang,
    OsdKill,
    OsdNearFull,
    StorageOutage,
    StorageSlow,
)
from gpufleet.chaos.backends.base import Backend, NodeInfo, Plan
from gpufleet.chaos.guard import osd_blast_radius
from gpufleet.chaos.ledger import Ledger, Rollback
from gpufleet.core.ceph_admin import CephCommandError, ceph_run
from gpufleet.core.procs import alive, children
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.core.sandbox_contract import SandboxProcess
from gpufleet.core.slurm_state import NodeObs
from gpufleet.core.storage_contract import (
    JUICEFS_MOUNT,
    JUICEFS_REDIS,
    JuiceFsRecord,
    StorageSandboxState,
    read_storage_state,
    storage_state_path,
)

OSD_KINDS = frozenset({"osd-kill", "osd-hang"})
# Near full: the ratios set while the fault lasts (Ceph wants nearfull < backfillfull < full, or it
# raises OSD_OUT_OF_ORDER_FULL). Any OSD holding data uses more than 1 % of its 4 GiB device.
NEARFULL_RATIO = 0.01
FULL_RATIOS = {"nearfull_ratio": 0.01, "backfillfull_ratio": 0.015, "full_ratio": 0.02}
# What the rollback puts back: the ratios a cluster starts with (mon_osd_full_ratio 0.95,
# mon_osd_backfillfull_ratio 0.90, mon_osd_nearfull_ratio 0.85, Ceph Pacific's option defaults),
# which the storage sandbox never changes. Known at plan time without asking the cluster, so the
# ledger entry is written before anything is touched.
CEPH_DEFAULT_RATIOS = {"full_ratio": 0.95, "backfillfull_ratio": 0.90, "nearfull_ratio": 0.85}


class StorageBackend(Backend):
    name = "storage"
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset(
        {OsdKill, OsdHang, OsdNearFull, ObjectStoreOutage, BucketLoss, MetadataEngineLoss, JuicefsClientKill}
    )
    not_offered: ClassVar[dict[type[InjectionModel], str]] = {
        StorageOutage: "the checkpoint directory is the Slurm sandbox's: use backend sandbox",
        StorageSlow: "no throttle on radosgw's loopback port yet",
    }

    def __init__(self, stack: str, state_root: Path | None = None, ledger: Ledger | None = None) -> None:
        self.stack = stack
        self.state_root = state_root
        self.ledger = ledger
        path = storage_state_path(stack, state_root)
        try:
            self.state: StorageSandboxState = read_storage_state(stack, state_root)
        except FileNotFoundError:
            raise ActivityFailed(
                f"no storage sandbox at {path}: bring it up with "
                f"`gpufleet sandbox up --storage --stack {stack}`"
            ) from None
        if self.state.phase != "up":
            raise ActivityFailed(f"storage sandbox {stack} is {self.state.phase}, not up ({path})")

    # ------------------------------------------------------------ observations (no nodes)
    def nodes(self) -> list[NodeInfo]:
        return []

    def node_states(self) -> dict[str, NodeObs]:
        return {}

    def dead_daemons(self) -> list[str]:
        return [p.name for p in self.state.processes if not alive(p.pid, p.start_time)]

    # ------------------------------------------------------------ helpers
    def _args(self, **more: Any) -> dict[str, Any]:
        return {"stack": self.stack, "state_root": str(self.state_root) if self.state_root else None, **more}

    def _osd(self, osd: int) -> SandboxProcess:
        try:
            return self.state.process(f"ceph-osd.{osd}")
        except KeyError:
            raise InvalidActivity(
                f"there is no osd.{osd}: the cluster has osd.0 to osd.{len(self.state.osds) - 1}"
            ) from None

    def osds_down(self) -> set[int]:
        """OSDs whose daemon is not running or is a pending fault in the ledger."""
        down = {
            int(p.name.split(".", 1)[1])
            for p in self.state.processes
            if p.name.startswith("ceph-osd.") and not alive(p.pid, p.start_time)
        }
        if self.ledger is not None:
            down |= {int(r.target["osd"]) for r in self.ledger.pending() if r.kind in OSD_KINDS}
        return down

    def _guard_osd(self, osd: int) -> None:
        reasons = osd_blast_radius(
            self.osds_down(),
            osd,
            len(self.state.osds),
            self.state.pool_size or 1,
            self.state.pool_min_size or 1,
        )
        if reasons:
            raise InvalidActivity("blast-radius guard refused: " + "; ".join(reasons))

    @staticmethod
    def _signal(p: SandboxProcess, sig: int) -> dict[str, Any]:
        if not alive(p.pid, p.start_time):
            raise ActivityFailed(f"{p.name} (pid {p.pid}) is not running: nothing to fault")
        os.kill(p.pid, sig)
        return {"pid": p.pid, "signal": signal.Signals(sig).name}

    # ------------------------------------------------------------ plans
    def plan_osd_kill(self, inj: OsdKill) -> Plan:
        p = self._osd(inj.osd)
        self._guard_osd(inj.osd)

        def apply() -> dict[str, Any]:
            out = self._signal(p, signal.SIGKILL)
            if inj.out:
                try:
                    ceph_run(self.state, "osd", "out", str(inj.osd))
                except CephCommandError as e:
                    raise ActivityFailed(str(e)) from None
                out["marked_out"] = True
            return out

        args = self._args(name=p.name, launch=p.launch.model_dump())
        if inj.out:
            args["osd_in"] = inj.osd
        return Plan(
            kind=inj.method,
            target={"osd": inj.osd},
            params=inj.params(),
            rollback=Rollback("storage.restart-daemon", args),
            apply=apply,
            summary=f"kill {p.name} (pid {p.pid}) with SIGKILL" + (" and mark it out" if inj.out else ""),
        )

    def plan_osd_hang(self, inj: OsdHang) -> Plan:
        p = self._osd(inj.osd)
        self._guard_osd(inj.osd)
        return Plan(
            kind=inj.method,
            target={"osd": inj.osd},
            params=inj.params(),
            rollback=Rollback("storage.continue-daemon", {"pid": p.pid, "start_time": p.start_time}),
            apply=lambda: self._signal(p, signal.SIGSTOP),
            summary=f"freeze {p.name} (pid {p.pid}) with SIGSTOP",
        )

    def plan_object_store_outage(self) -> Plan:
        p = self.state.process("radosgw")
        return Plan(
            kind="object-store-outage",
            target={"service": "radosgw"},
            params={},
            rollback=Rollback(
                "storage.restart-daemon", self._args(name=p.name, launch=p.launch.model_dump())
            ),
            apply=lambda: self._signal(p, signal.SIGKILL),
            summary=f"kill radosgw (pid {p.pid}): {self.state.s3_endpoint} stops answering",
        )

    def _set_ratios(self, ratios: dict[str, float]) -> dict[str, Any]:
        # Narrowest first on the way down, so nearfull < backfillfull < full holds at every step.
        for cmd, key in (
            ("set-nearfull-ratio", "nearfull_ratio"),
            ("set-backfillfull-ratio", "backfillfull_ratio"),
            ("set-full-ratio", "full_ratio"),
        ):
            if key in ratios:
                try:
                    ceph_run(self.state, "osd", cmd, str(ratios[key]))
                except CephCommandError as e:
                    raise ActivityFailed(str(e)) from None
        return {"ratios": ratios}

    def plan_osd_near_full(self, inj: OsdNearFull) -> Plan:
        before = dict(CEPH_DEFAULT_RATIOS)
        during = dict(FULL_RATIOS) if inj.full else {"nearfull_ratio": NEARFULL_RATIO}
        return Plan(
            kind=inj.method,
            target={"cluster": self.state.fsid or self.stack},
            params=inj.params(),
            rollback=Rollback("storage.full-ratios", self._args(**before)),
            apply=lambda: self._set_ratios(during),
            summary=f"set Ceph's {', '.join(f'{k} {v:g}' for k, v in during.items())} (rollback: "
            f"{', '.join(f'{k} {v:g}' for k, v in before.items())})",
        )

    def plan_bucket_loss(self) -> Plan:
        bucket = self.state.checkpoint_bucket
        if bucket is None:
            raise ActivityFailed(f"the storage sandbox of {self.stack} has no checkpoint bucket")
        return Plan(
            kind="bucket-loss",
            target={"bucket": bucket},
            params={},
            rollback=Rollback("storage.restore-bucket", self._args()),
            apply=lambda: self._delete_bucket(bucket),
            summary=f"delete bucket {bucket} and every object in it (the backups in "
            f"{self.state.backup_bucket} stay)",
        )

    def _delete_bucket(self, bucket: str, attempts: int = 5) -> dict[str, Any]:
        """Every object, then the bucket. One DELETE per object: DeleteObjects needs a checksum header
        that Ceph 16 does not understand (core.s3)."""
        client = store_for(self.state, bucket).client
        deleted = 0
        for _ in range(attempts):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for o in page.get("Contents", []):
                    client.delete_object(Bucket=bucket, Key=o["Key"])
                    deleted += 1
            try:
                client.delete_bucket(Bucket=bucket)
                return {"bucket": bucket, "objects_deleted": deleted}
            except ClientError as e:
                # The checkpoint writer may have put an object since the listing: list again.
                if str(e.response.get("Error", {}).get("Code")) != "BucketNotEmpty":
                    raise
        raise ActivityFailed(f"bucket {bucket} kept filling up during {attempts} rounds of deletes")

    # ------------------------------------------------------------ JuiceFS
    def _juicefs(self) -> JuiceFsRecord:
        if self.state.juicefs is None:
            raise InvalidActivity(
                f"the storage sandbox of {self.stack} has no JuiceFS: the stack has no storage.juicefs"
            )
        return self.state.juicefs

    def plan_metadata_engine_loss(self) -> Plan:
        rec = self._juicefs()
        redis = self.state.process(JUICEFS_REDIS)
        mount = self.state.process(JUICEFS_MOUNT)

        def apply() -> dict[str, Any]:
            out = self._signal(redis, signal.SIGKILL)
            wiped = []
            for entry in sorted(Path(rec.meta_dir).iterdir()):
                wiped.append(entry.name)
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            return {**out, "wiped": wiped}

        return Plan(
            kind="metadata-engine-loss",
            target={"service": JUICEFS_REDIS, "meta_url": rec.meta_url},
            params={},
            rollback=Rollback(
                "storage.restore-metadata",
                self._args(redis=redis.launch.model_dump(), mount=mount.launch.model_dump()),
            ),
            apply=apply,
            summary=f"kill Redis (pid {redis.pid}, {rec.meta_url}) and wipe {rec.meta_dir}; rollback: "
            f"load the newest verified dump from {self.state.backup_bucket} and mount again",
        )

    def plan_juicefs_client_kill(self) -> Plan:
        rec = self._juicefs()
        mount = self.state.process(JUICEFS_MOUNT)

        def apply() -> dict[str, Any]:
            # The watchdog first (it would start a new FUSE process), then the FUSE process(es).
            kids = children(mount.pid)
            out = self._signal(mount, signal.SIGKILL)
            for pid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return {**out, "children_killed": kids}

        return Plan(
            kind="juicefs-client-kill",
            target={"mountpoint": rec.mountpoint},
            params={},
            rollback=Rollback("storage.remount", self._args(mount=mount.launch.model_dump())),
            apply=apply,
            summary=f"kill the JuiceFS client of {rec.mountpoint} (pid {mount.pid} and its FUSE "
            "process): Transport endpoint is not connected; rollback: unmount and mount again",
        )
