"""JuiceFS in the storage sandbox, realised from the stack's `storage.juicefs`: a real Redis metadata
engine on loopback, `juicefs format` on a bucket of radosgw, `juicefs mount` under the run folder,
and a scratch Redis the metadata backups are loaded into (metadata_backup.py).

  redis-server ─► juicefs format (S3: radosgw, bucket storage.juicefs.bucket) ─► juicefs mount
  redis-server (scratch, another port)

Each process is started from a recorded Launch recipe (ceph.py's `_Run.start`), like the Ceph
daemons; `down` unmounts first (gpufleet.sandbox.storage.ceph.storage_down).

From the stack: the volume's name, its bucket, the metadata engine's scheme (Redis only here) and
database number (`metaUrl`'s path); the host and port are the sandbox's own (loopback, chosen free
at bring-up), the cache folder is under the run folder and its size at most CACHE_MIB_MAX.
`storage.checkpoint.location` `juicefs://<name>/<folder>` puts the checkpoint writer on the mount;
anything else keeps it on the checkpoint bucket (direct S3).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from gpufleet.config.model import StackSpec
from gpufleet.core import juicefs as jfs
from gpufleet.core import mounts
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.job_checkpoints import JOB_FOLDER_PREFIX
from gpufleet.core.storage_contract import (
    JUICEFS_MOUNT,
    JUICEFS_REDIS,
    JUICEFS_SCRATCH,
    JuiceFsRecord,
    S3Credentials,
    StorageSandboxState,
)

REDIS, REDIS_SCRATCH, MOUNT = JUICEFS_REDIS, JUICEFS_SCRATCH, JUICEFS_MOUNT
PORT_NAMES = ("redis", "redis-scratch", "juicefs-metrics")
# The sandbox's read cache, whatever cacheSizeGiB says for a real node (a disk cache: it holds
# blocks read back, and the sandbox's checkpoints are a few MiB each).
CACHE_MIB_MAX = 512
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules


@dataclass(frozen=True)
class JuiceFsPlan:
    name: str
    bucket: str
    db: int
    cache_mib: int
    checkpoint_folder: str | None  # under the mount, when the stack checkpoints to JuiceFS


def checkpoint_folder(spec: StackSpec) -> str | None:
    """The folder under the mount the checkpoints go to (`juicefs://<name>/<folder>`), or None
    (direct S3). InputError when the location names a JuiceFS volume the stack does not have."""
    loc = spec.storage.checkpoint.location
    if not loc.startswith("juicefs://"):
        return None
    parts = urlsplit(loc)
    js = spec.storage.juicefs
    if js is None or parts.netloc != js.name:
        have = f"storage.juicefs.name is {js.name!r}" if js else "the stack has no storage.juicefs"
        raise InputError(
            "stack",
            [Problem("storage.checkpoint.location", f"{loc!r} names volume {parts.netloc!r}; {have}")],
        )
    folder = parts.path.strip("/")
    if not folder or ".." in folder.split("/"):
        raise InputError(
            "stack", [Problem("storage.checkpoint.location", f"{loc!r}: no folder under the volume")]
        )
    return folder


def training_checkpoint_dir(
    stack_name: str,
    spec: StackSpec,
    storage: StorageSandboxState | None,
    is_mounted: Callable[[Path], bool],
    run_id: str,
) -> Path | None:
    """Where the Slurm sandbox's training job checkpoints: a folder of its own on the stack's JuiceFS
    volume when `storage.checkpoint.location` is `juicefs://` (beside the checkpoint writer's
    checkpoints, which FsCheckpointStore tells apart by name), else None (the run folder's).

    The storage sandbox must be up and mounted first: its mount reaches a node's processes only when
    its shared folder was there before the node's namespace (core.mounts). InputError otherwise,
    never a silent fallback to a local folder."""
    folder = checkpoint_folder(spec)
    if folder is None:
        return None
    rec = storage.juicefs if storage is not None and storage.phase == "up" else None
    if rec is None or rec.checkpoint_dir is None or not is_mounted(Path(rec.mountpoint)):
        where = "not up" if rec is None else f"not mounted at {rec.mountpoint}"
        raise InputError(
            f"stack {stack_name}",
            [
                Problem(
                    "storage.checkpoint.location",
                    f"{spec.storage.checkpoint.location!r}: the training job checkpoints on the storage "
                    f"sandbox's JuiceFS volume, which is {where}: run `gpufleet sandbox up --storage "
                    f"--stack {stack_name}` first",
                )
            ],
        )
    return Path(rec.checkpoint_dir) / f"{JOB_FOLDER_PREFIX}{run_id}"


def plan_juicefs(stack_name: str, spec: StackSpec) -> JuiceFsPlan | None:
    """None when the stack has no storage.juicefs; InputError naming the stack file's paths when the
    sandbox cannot realise it."""
    js = spec.storage.juicefs
    if js is None:
        if spec.storage.checkpoint.location.startswith("juicefs://"):
            checkpoint_folder(spec)  # raises: names the missing section
        return None
    problems = []
    url = js.meta_url.plain
    db = 1
    if url is None:
        problems.append(
            Problem("storage.juicefs.metaUrl", "the sandbox needs it in plain text (a sandbox stack)")
        )
    else:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            problems.append(
                Problem(
                    "storage.juicefs.metaUrl",
                    f"scheme {parts.scheme!r}: the sandbox's metadata engine is Redis",
                )
            )
        path = parts.path.strip("/")
        if path and not path.isdigit():
            problems.append(
                Problem("storage.juicefs.metaUrl", f"database {path!r} is not a Redis database number")
            )
        elif path:
            db = int(path)
    if js.storage not in ("s3", "ceph"):
        problems.append(
            Problem("storage.juicefs.storage", f"{js.storage!r}: the sandbox's object store is radosgw (s3)")
        )
    if not _BUCKET.match(js.bucket):
        problems.append(
            Problem("storage.juicefs.bucket", f"{js.bucket!r}: the sandbox needs a plain bucket name")
        )
    ceph = spec.storage.ceph
    if ceph is not None and js.bucket in (ceph.object_store, f"{ceph.object_store}-backup"):
        problems.append(
            Problem("storage.juicefs.bucket", f"{js.bucket!r} is already the checkpoint or backup bucket")
        )
    try:
        folder = checkpoint_folder(spec)
    except InputError as e:
        problems.extend(e.problems)
        folder = None
    if problems:
        raise InputError(f"stack {stack_name}", problems)
    return JuiceFsPlan(js.name, js.bucket, db, min(js.cache_size_gib * 1024, CACHE_MIB_MAX), folder)


def record_for(plan: JuiceFsPlan, base: Path, ports: dict[str, int]) -> JuiceFsRecord:
    d = base / "juicefs"
    mountpoint = d / "mnt"
    return JuiceFsRecord(
        name=plan.name,
        meta_url=jfs.redis_url(ports["redis"], plan.db),
        meta_port=ports["redis"],
        meta_db=plan.db,
        meta_dir=str(d / "redis"),
        scratch_port=ports["redis-scratch"],
        bucket=plan.bucket,
        mountpoint=str(mountpoint),
        cache_dir=str(d / "cache"),
        cache_mib=plan.cache_mib,
        metrics=f"127.0.0.1:{ports['juicefs-metrics']}",
        checkpoint_dir=str(mountpoint / plan.checkpoint_folder) if plan.checkpoint_folder else None,
    )


# --------------------------------------------------------------------------- bring-up (I/O)


class Starter(Protocol):
    def start(self, name: str, program: list[str]) -> None: ...
    def wait(self, what: str, check: Callable[[], Any], interval_s: float = 0.5) -> Any: ...


def redis_answers(port: int, db: int | None = None) -> bool:
    return jfs.run(jfs.redis_cli(port, "PING", db=db), timeout_s=5).strip() == "PONG"


def bring_up(
    run: Starter,
    rec: JuiceFsRecord,
    s3_endpoint: str,
    creds: S3Credentials,
    create_bucket: Callable[[str], None],
) -> None:
    """Both Redis servers, the volume formatted on radosgw, and the mount answering."""
    d = Path(rec.meta_dir).parent
    for sub in ("redis", "redis-scratch", "cache", "mnt"):
        (d / sub).mkdir(parents=True, mode=0o700, exist_ok=True)
    run.start(REDIS, jfs.redis_server_argv(rec.meta_port, Path(rec.meta_dir)))
    run.start(REDIS_SCRATCH, jfs.redis_server_argv(rec.scratch_port, d / "redis-scratch"))
    run.wait("the metadata engine (Redis)", lambda: redis_answers(rec.meta_port))
    run.wait("the scratch Redis", lambda: redis_answers(rec.scratch_port))
    create_bucket(rec.bucket)
    jfs.run(
        jfs.format_argv(rec.meta_url, rec.name, f"{s3_endpoint}/{rec.bucket}"),
        env=jfs.s3_env(creds.access_key, creds.secret_key),
    )
    # The mount's folder a shared mount before anything is mounted in it: the Slurm sandbox's
    # training job, started later in node namespaces, then sees the volume, and sees it again
    # after a rollback or a restore mounts it anew (core.mounts says why; ADR 0068).
    mounts.make_shared(d)
    start_mount(run, rec)
    if rec.checkpoint_dir is not None:
        Path(rec.checkpoint_dir).mkdir(parents=True, exist_ok=True)


def start_mount(run: Starter, rec: JuiceFsRecord) -> None:
    run.start(
        MOUNT,
        jfs.mount_argv(rec.meta_url, Path(rec.mountpoint), Path(rec.cache_dir), rec.cache_mib, rec.metrics),
    )
    run.wait(f"JuiceFS {rec.name} mounted at {rec.mountpoint}", lambda: jfs.mounted(Path(rec.mountpoint)))
