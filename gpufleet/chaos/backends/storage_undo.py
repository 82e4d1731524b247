"""Rollbacks of the storage backend's faults, replayable from the fault ledger alone.

Each takes the JSON arguments its plan recorded: the Launch recipe of a daemon to start again, a
process to thaw, Ceph's previous full ratios, or the stack whose checkpoint bucket to restore from
its backups. Each tolerates a fault that is already gone (idempotent), as `gpufleet chaos revert`
may replay it after a crash.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from chaoslib.exceptions import ActivityFailed

from gpufleet.core import juicefs as jfs
from gpufleet.core.ceph_admin import CephCommandError, ceph_run
from gpufleet.core.checkpoint_manifest import stem
from gpufleet.core.fs_checkpoints import FsCheckpointStore
from gpufleet.core.job_checkpoints import job_folders, verify_folder
from gpufleet.core.jsonl import append_objects
from gpufleet.core.juicefs_backups import advance_slice_counter, restore_newest
from gpufleet.core.procs import alive, children, launch, start_time
from gpufleet.core.s3_checkpoints import S3CheckpointStore, store_for
from gpufleet.core.s3_job_checkpoints import copy_fence, job_prefixes
from gpufleet.core.sandbox_contract import Launch
from gpufleet.core.storage_contract import (
    BACKUP_PREFIX,
    JUICEFS_MOUNT,
    JUICEFS_REDIS,
    JuiceFsRecord,
    StorageSandboxState,
    read_storage_state,
    write_storage_state,
)

logger = logging.getLogger("chaostoolkit")
RESTORE_EVENTS = "restore"
RESTORE_NEWEST = 5  # checkpoints brought back by a restore: what a job resumes from, and its cost


def _state(args: dict[str, Any]) -> StorageSandboxState | None:
    root = args.get("state_root")
    try:
        return read_storage_state(str(args["stack"]), Path(root) if root else None)
    except (OSError, ValueError) as e:
        logger.warning("storage sandbox of %s unreadable (%s): nothing to undo", args.get("stack"), e)
        return None


def _running(program: list[str]) -> int | None:
    """The PID of a process whose command line is exactly `program`, if one runs."""
    want = "\0".join(program).encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == want and start_time(int(entry.name)) is not None:
                    return int(entry.name)
            except OSError:
                continue
    return None


def rb_restart_daemon(args: dict[str, Any]) -> None:
    """Start a killed daemon again from its recorded Launch recipe (unless it already runs), and
    keep the storage state naming the new process."""
    state = _state(args)
    if state is None or state.phase not in ("up", "creating"):
        return
    recipe = Launch.model_validate(args["launch"])
    if _running(recipe.program) is None:
        _start(state, recipe, args)
    if args.get("osd_in") is not None:  # an OSD marked out as lost: back in, Ceph rebalances onto it
        try:
            ceph_run(state, "osd", "in", str(args["osd_in"]))
        except CephCommandError as e:
            raise ActivityFailed(str(e)) from None


def _start(state: StorageSandboxState, recipe: Launch, args: dict[str, Any]) -> None:
    popen, st = launch(recipe)
    if st is None:
        raise ActivityFailed(f"restarting {args['name']} failed at once ({popen.wait(5)}); see {recipe.log}")
    # This process is the daemon's parent until it exits: reap it then (no zombie), from a thread
    # that does nothing else (a long-lived caller, such as a test run, must not hold a zombie).
    threading.Thread(target=popen.wait, name=f"reap-{args['name']}", daemon=True).start()
    procs = [
        p.model_copy(update={"pid": popen.pid, "start_time": st}) if p.name == args["name"] else p
        for p in state.processes
    ]
    root = args.get("state_root")
    write_storage_state(state.model_copy(update={"processes": procs}), Path(root) if root else None)


def rb_thrash_revert(args: dict[str, Any]) -> None:
    """Undo the OSD thrasher (chaos.storage.thrash): every OSD not running started again from its
    recorded Launch recipe, then every OSD marked in. Idempotent: a running OSD is left alone and
    marking an OSD that is in `in` again changes nothing."""
    state = _state(args)
    if state is None or state.phase not in ("up", "creating"):
        return
    for name, launch_doc in sorted(dict(args["osds"]).items()):
        rb_restart_daemon({**args, "name": name, "launch": launch_doc})
    ids = [name.split(".", 1)[1] for name in sorted(dict(args["osds"]))]
    try:
        ceph_run(state, "osd", "in", *ids)
    except CephCommandError as e:
        raise ActivityFailed(str(e)) from None


def rb_continue_daemon(args: dict[str, Any]) -> None:
    """SIGCONT a stopped daemon (if it is still the process that was stopped)."""
    pid, st = int(args["pid"]), int(args["start_time"])
    if alive(pid, st):
        os.kill(pid, signal.SIGCONT)


def rb_full_ratios(args: dict[str, Any]) -> None:
    """Put Ceph's full, backfillfull and nearfull ratios back (widest first, so they never cross)."""
    state = _state(args)
    if state is None:
        return
    for cmd, key in (
        ("set-full-ratio", "full_ratio"),
        ("set-backfillfull-ratio", "backfillfull_ratio"),
        ("set-nearfull-ratio", "nearfull_ratio"),
    ):
        try:
            ceph_run(state, "osd", cmd, str(args[key]))
        except CephCommandError as e:
            raise ActivityFailed(str(e)) from None


def rb_restore_bucket(args: dict[str, Any]) -> None:
    """Recreate the checkpoint bucket if it is gone and restore every backed-up checkpoint that
    verifies into it (each copy read back and checked against its manifest); the result is a line
    of the storage sandbox's `restore` events, which the drill's probe reads."""
    state = _state(args)
    if state is None or state.checkpoint_bucket is None or state.backup_bucket is None:
        return
    started = time.time()
    primary = store_for(state, state.checkpoint_bucket)
    try:
        primary.client.head_bucket(Bucket=state.checkpoint_bucket)
    except ClientError:
        primary.client.create_bucket(Bucket=state.checkpoint_bucket)
    backup = store_for(state, state.backup_bucket, BACKUP_PREFIX)
    restored, failed = _restore_store(backup, primary)
    # Training jobs that checkpoint straight to the bucket (ADR 0070): each job's prefix as well,
    # recorded as the drills read a job's restored checkpoints (job_verified / job_corrupt).
    job_verified: list[dict[str, Any]] = []
    job_corrupt: list[dict[str, Any]] = []
    for prefix in job_prefixes(backup.client, state.backup_bucket, BACKUP_PREFIX):
        target = prefix[len(BACKUP_PREFIX):]
        src = store_for(state, state.backup_bucket, prefix)
        dst = store_for(state, state.checkpoint_bucket, target)
        copy_fence(src, dst)  # the fence first: the job prunes, and a stale generation is refused
        good, bad = _restore_store(src, dst)
        folder = target.rstrip("/").rsplit("/", 1)[-1]
        job_verified += [{**r, "folder": folder} for r in good]
        job_corrupt += [{**r, "folder": folder} for r in bad]
    event = {
        "t": time.time(),
        "event": "restore",
        "started_at": started,
        "restored": restored,
        "failed": failed,
        "job_verified": job_verified,
        "job_corrupt": job_corrupt,
    }
    append_objects(state.events_file(RESTORE_EVENTS), [event])
    if failed or job_corrupt:
        raise ActivityFailed(f"{len(failed) + len(job_corrupt)} backed-up checkpoint(s) did not restore "
                             f"verified: {failed + job_corrupt}")


def _restore_store(backup: S3CheckpointStore, primary: S3CheckpointStore) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """Copy back, newest first, at most RESTORE_NEWEST verified checkpoints the primary lacks (what
    a job resumes from, and the RTO's cost): the ones restored verified, and the ones that did not."""
    have = {(m.job, m.restart, m.step) for m in primary.complete()}
    restored: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for m in sorted(backup.complete(), key=lambda m: (m.job, m.restart, m.step), reverse=True):
        if len(restored) >= RESTORE_NEWEST:
            break
        key = (m.job, m.restart, m.step)
        if key in have:
            continue
        problems = backup.copy_to(m, primary)
        (failed if problems else restored).append(
            {
                "checkpoint": stem(key),
                "key": list(key),
                "step": m.step,
                "written_at": m.written_at,
                "problems": problems,
            }
        )
    return restored, failed


# ----------------------------------------------------------------------------- JuiceFS

METADATA_RESTORE_EVENTS = "metadata-restore"
MOUNT_WAIT_S = 30.0
ENGINE_WAIT_S = 15.0


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (jfs.JuiceFsError, OSError):
            pass
        time.sleep(0.2)
    raise ActivityFailed(f"{what} not within {timeout_s:g} s")


def _stop_mount(state: StorageSandboxState) -> None:
    """Kill what is left of the mount's client and unmount (lazily: a dead client's mount answers
    ENOTCONN, a blocked one may hold calls)."""
    assert state.juicefs is not None
    mountpoint = Path(state.juicefs.mountpoint)
    connection = jfs.fuse_connection(mountpoint)
    try:
        p = state.process(JUICEFS_MOUNT)
    except KeyError:
        p = None
    if p is not None and alive(p.pid, p.start_time):
        for pid in [p.pid, *children(p.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if connection is not None:
        jfs.abort_fuse(connection)  # nothing may stay blocked on the old client (core.juicefs)
    if jfs.mounted(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=30)


def _remount(state: StorageSandboxState, recipe: Launch, args: dict[str, Any]) -> None:
    """Stop what is left of the mount's client and mount again from the recorded recipe."""
    assert state.juicefs is not None
    mountpoint = Path(state.juicefs.mountpoint)
    _stop_mount(state)
    _start(state, recipe, {**args, "name": JUICEFS_MOUNT})
    _wait(f"JuiceFS mounted again at {mountpoint}", lambda: jfs.mounted(mountpoint) and mountpoint.is_dir(),
          MOUNT_WAIT_S)


def rb_remount(args: dict[str, Any]) -> None:
    """Mount the JuiceFS volume again after its client was killed (unless it answers already)."""
    state = _state(args)
    if state is None or state.juicefs is None or state.phase not in ("up", "creating"):
        return
    mountpoint = Path(state.juicefs.mountpoint)
    try:
        p = state.process(JUICEFS_MOUNT)
        if alive(p.pid, p.start_time) and jfs.mounted(mountpoint) and mountpoint.is_dir():
            return
    except (KeyError, OSError):
        pass
    _remount(state, Launch.model_validate(args["mount"]), args)


def _empty(folder: Path) -> None:
    for entry in folder.iterdir() if folder.is_dir() else []:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _engine_formatted(rec: JuiceFsRecord) -> bool:
    """Whether the metadata engine holds a JuiceFS volume (its `setting` key, JuiceFS's Redis layout)."""
    out = jfs.run(jfs.redis_cli(rec.meta_port, "EXISTS", jfs.VOLUME_SETTING_KEY, db=rec.meta_db), timeout_s=5)
    return out.strip() == "1"


def rb_restore_metadata(args: dict[str, Any]) -> None:
    """After a metadata engine loss: start Redis again from its recipe, load the newest verified
    `juicefs dump` from the backup bucket when the engine is empty, mount again, and verify every
    checkpoint on the mount against its manifest. The result is a line of the `metadata-restore`
    events, which the drill's probe reads."""
    state = _state(args)
    if state is None or state.juicefs is None or state.backup_bucket is None:
        return
    rec, bucket = state.juicefs, state.backup_bucket
    started = time.time()
    redis = Launch.model_validate(args["redis"])
    try:
        p = state.process(JUICEFS_REDIS)
        running = alive(p.pid, p.start_time)
    except KeyError:
        running = False
    if not running:
        Path(rec.meta_dir).mkdir(parents=True, exist_ok=True)
        _start(state, redis, {**args, "name": JUICEFS_REDIS})
        state = _state(args) or state
    _wait("the metadata engine (Redis) answering",
          lambda: jfs.run(jfs.redis_cli(rec.meta_port, "PING"), timeout_s=5).strip() == "PONG", ENGINE_WAIT_S)
    loaded: dict[str, Any] | None = None
    if not _engine_formatted(rec):
        # The old client reconnects to the empty engine and writes its session keys there, and
        # `juicefs load` refuses a database that is not empty: stop it first (it is mounted again
        # below), then clear what it wrote (the engine holds no volume: nothing else is there).
        _stop_mount(state)
        jfs.run(jfs.redis_cli(rec.meta_port, "FLUSHDB", db=rec.meta_db), timeout_s=10)
        client = store_for(state, bucket).client
        try:
            chosen = restore_newest(rec, client, bucket, state.credentials(),
                                    Path(state.base_dir) / "juicefs" / "restore-work")
            counter = advance_slice_counter(rec, client)
        except jfs.JuiceFsError as e:
            raise ActivityFailed(f"metadata restore failed: {e}") from None
        loaded = {"dump": chosen.dump, "taken_at": chosen.taken_at, "files": chosen.files,
                  "inodes": chosen.inodes, "slice_counter": counter}
        # Left by itself the restored engine would hand out again the slice ids the lost one gave
        # out after the dump, and the client's disk cache keys blocks by slice id and size. Seen
        # here before the counter was moved: a checkpoint written after the restore read back with
        # another sha256 until the cache was emptied; and gc counted 14 leaks, then deleted 13 (a new
        # block had overwritten one). The counter now moves past them (advance_slice_counter); the
        # cache is emptied still, so that a counter moved too little cannot serve a stale block.
        _empty(Path(rec.cache_dir))
    loaded_at = time.time()
    _remount(state, Launch.model_validate(args["mount"]), args)
    verified, corrupt = _verify_mount(state)
    job_verified, job_corrupt = _verify_jobs(state)
    done = time.time()  # restored and verified: what the drill's RTO ends at; the gc below is cleanup
    event = {
        "t": done,
        "event": "metadata-restore",
        "started_at": started,
        "loaded": loaded,
        "loaded_at": loaded_at,
        "verified": verified,
        "corrupt": corrupt,
        "job_verified": job_verified,
        "job_corrupt": job_corrupt,
        "gc": _collect_leaks(rec, started) if loaded is not None else None,
    }
    append_objects(state.events_file(METADATA_RESTORE_EVENTS), [event])
    if corrupt or job_corrupt:
        raise ActivityFailed(
            f"{len(corrupt) + len(job_corrupt)} checkpoint(s) on the mount do not verify after the "
            f"restore: {corrupt + job_corrupt}"
        )


GC_TIMEOUT_S = 120.0


def _collect_leaks(rec: JuiceFsRecord, restore_started: float) -> dict[str, Any]:
    """`juicefs gc` after a metadata restore: the objects the lost engine named after its dump are
    in the volume's bucket still, and the restored engine names none of them (leaks). A count
    first (no --delete), then --delete, then a count again that must find none. Objects modified
    since the restore started are left alone (JFS_GC_SKIPPEDTIME): the mounted client writes them,
    and a block it uploaded but has not committed yet is not a leak."""
    t0 = time.time()
    skip = math.ceil(t0 - restore_started) + 1

    def skip_now(later: bool) -> int:
        # JFS_GC_SKIPPEDTIME is whole seconds counted back from each pass's own start, so one value
        # for all three passes moves the cut-off: an old-client object just inside the window aged
        # out of it between passes and was counted after the delete (seen once in the e2e tier: 10
        # found, 11 deleted, 3 left). The delete pass's cut-off is never earlier than the first
        # pass's (floor: it deletes at least what was found, and still nothing modified since the
        # restore started), the last pass's never later (ceil: it counts only what the delete saw).
        elapsed = time.time() - t0
        return skip + (math.ceil(elapsed) if later else math.floor(elapsed))

    try:
        found = jfs.gc(rec.meta_url, delete=False, skip_newer_than_s=skip, timeout_s=GC_TIMEOUT_S)
        deleted = jfs.gc(rec.meta_url, delete=True, skip_newer_than_s=skip_now(False), timeout_s=GC_TIMEOUT_S)
        left = jfs.gc(rec.meta_url, delete=False, skip_newer_than_s=skip_now(True), timeout_s=GC_TIMEOUT_S)
    except jfs.JuiceFsError as e:
        logger.error("juicefs gc after the metadata restore failed: %s", e)
        return {"error": str(e), "seconds": round(time.time() - t0, 2)}
    return {
        "scanned": found.scanned,
        "leaked_found": found.leaked,
        "leaked_bytes": found.leaked_bytes,
        "deleted": deleted.leaked,
        "leaked_after": left.leaked,
        "skipped_newer": found.skipped,
        "skip_newer_than_s": skip,
        "seconds": round(time.time() - t0, 2),
    }


def _verify_jobs(state: StorageSandboxState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every complete checkpoint of the training jobs that checkpoint on the volume (the Slurm
    sandbox's, core.job_checkpoints), checked by sha256 against its manifest."""
    assert state.juicefs is not None
    if state.juicefs.checkpoint_dir is None:
        return [], []
    verified: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    for folder in job_folders(Path(state.juicefs.checkpoint_dir)):
        good, bad = verify_folder(folder)
        verified += [{"folder": folder.name, "checkpoint": g.key.stem, "key": [g.key.job, g.key.restart,
                      g.key.step], "step": g.key.step, "written_at": g.manifest.written_at} for g in good]
        corrupt += [{"folder": folder.name, "checkpoint": k.stem, "step": k.step, "problems": [why]}
                    for k, why in bad]
    return verified, corrupt


def _verify_mount(state: StorageSandboxState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every complete checkpoint on the mount checked by sha256 against its manifest."""
    assert state.juicefs is not None
    if state.juicefs.checkpoint_dir is None:
        return [], []
    store = FsCheckpointStore(Path(state.juicefs.checkpoint_dir))
    verified: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    for c in store.candidates():
        if c.manifest is None:
            continue
        problems = store.verify(c.manifest)
        if problems and store.manifest(c.key) is None:
            continue  # pruned by the writer while being checked: retention, not corruption
        doc = {"checkpoint": stem(c.key), "key": list(c.key), "step": c.key[2],
               "written_at": c.manifest.written_at, "problems": problems}
        (corrupt if problems else verified).append(doc)
    return verified, corrupt
