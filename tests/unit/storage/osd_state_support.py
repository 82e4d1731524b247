"""The three-OSD storage sandbox state the thrasher's unit tests start from (no daemon runs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.core.storage_contract import OsdRecord, StorageSandboxState


def three_osd_state(root: Path, stack: str, bucket: str, program: Callable[[int], list[str]],
                    pid_base: int) -> StorageSandboxState:
    """Pools of size 2 / min_size 1 on OSDs 0-2; OSD i's recorded PID is `pid_base - i` (pick one no
    process has) and its recipe `program(i)`."""
    procs = [
        SandboxProcess(name=f"ceph-osd.{i}", pid=pid_base - i, start_time=1,
                       launch=Launch(program=program(i), log=str(root / f"osd{i}.log")))
        for i in range(3)
    ]
    return StorageSandboxState(
        stack=stack, run_id="abcdef", phase="up", base_dir=str(root / "run"), created_at=time.time(),
        ceph_conf=str(root / "ceph.conf"), pool_size=2, pool_min_size=1, checkpoint_bucket=bucket,
        osds=[OsdRecord(id=i, uuid=f"u{i}", data_dir="d", block="b", block_bytes=1) for i in range(3)],
        processes=procs,
    )
