"""Storage probes: the Slurm sandbox's checkpoint directory, and the storage sandbox's Ceph cluster
(health, the S3 endpoint, checkpoint integrity by sha256, a drill's RPO/RTO verdict)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine
from gpufleet.chaos.storage import job_drill
from gpufleet.core.ceph_admin import CephCommandError, ceph_json, pg_counts
from gpufleet.core.checkpoint_manifest import CheckpointManifest, stem
from gpufleet.core.fs_checkpoints import FsCheckpointStore, checkpoint_store_of
from gpufleet.core.jsonl import read_objects
from gpufleet.core.s3_checkpoints import S3CheckpointStore, store_for
from gpufleet.core.storage_contract import BACKUP_PREFIX, StorageSandboxState
from gpufleet.slo.dr import DrillInputs, DrTargets, RestoredCheckpoint, judge_drill

logger = logging.getLogger("chaostoolkit")

__all__ = [
    "ceph_health",
    "checkpoint_store_writable",
    "checkpoints_intact",
    "drill_within_targets",
    "object_store_available",
    "thrash_within_limits",
]


def checkpoint_store_writable(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """True when a file can be created, fsync'd and removed in the sandbox's checkpoint directory."""
    ctx = engine.context(configuration)
    if ctx.backend_name != "sandbox":
        raise ActivityFailed("checkpoint_store_writable checks the sandbox's checkpoint directory")
    from gpufleet.chaos.backends.sandbox import SandboxBackend

    b = ctx.backend()
    assert isinstance(b, SandboxBackend)
    path = b.state.checkpoint_dir
    if not path:
        raise ActivityFailed("the sandbox state names no checkpoint_dir")
    probe = os.path.join(path, f".gpufleet-probe-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)
    return True


def _state_root(ctx: engine.Context) -> Path | None:
    from gpufleet.chaos.backends.storage import StorageBackend

    b = ctx.backend()
    assert isinstance(b, StorageBackend)
    return b.state_root


def _storage(configuration: Configuration) -> StorageSandboxState:
    ctx = engine.context(configuration)
    if ctx.backend_name != "storage":
        raise ActivityFailed("this probe reads the storage sandbox: set gpufleet_backend to storage")
    from gpufleet.chaos.backends.storage import StorageBackend

    b = ctx.backend()
    assert isinstance(b, StorageBackend)
    return b.state


def ceph_health(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Ceph's health and placement groups: {"status", "checks", "pgs", "degraded_objects",
    "pgs_clean", "clean"}: pgs_clean when every PG is active+clean (recovery done), clean when that
    and HEALTH_OK. A cluster that
    does not answer is an ActivityFailed, never a healthy answer."""
    return _health(_storage(configuration))


def _health(state: StorageSandboxState) -> dict[str, Any]:
    try:
        health = ceph_json(state, "health", timeout_s=30)
        pg = ceph_json(state, "pg", "stat", timeout_s=30)
    except CephCommandError as e:
        raise ActivityFailed(str(e)) from None
    pgs = pg_counts(pg)
    summary = pg.get("pg_summary", pg)
    return {
        "status": health.get("status"),
        "checks": sorted((health.get("checks") or {}).keys()),
        "pgs": pgs.by_state,
        "degraded_objects": int(summary.get("degraded_objects", 0) or 0),
        "pgs_clean": pgs.all_clean,
        "clean": health.get("status") == "HEALTH_OK" and pgs.all_clean,
    }


def object_store_available(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """A real round trip on the S3 endpoint: PUT an object, GET it back and compare its sha256,
    DELETE it. {"status": "available" | "unavailable", "seconds", "error"}; tolerate with
    `{"type": "regex", "target": "status", "pattern": "^available$"}`."""
    state = _storage(configuration)
    assert state.checkpoint_bucket is not None
    store = store_for(state, state.checkpoint_bucket, attempts=1)
    data = os.urandom(4096)
    key = f"probe/{uuid.uuid4().hex}"
    t0 = time.monotonic()
    try:
        store.client.put_object(Bucket=store.bucket, Key=key, Body=data)
        got = store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read()
        store.client.delete_object(Bucket=store.bucket, Key=key)
    except Exception as e:  # any S3 or connection error is "unavailable", said with its reason
        return {
            "status": "unavailable",
            "seconds": round(time.monotonic() - t0, 3),
            "error": f"{type(e).__name__}: {e}",
        }
    same = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    return {
        "status": "available" if same else "unavailable",
        "seconds": round(time.monotonic() - t0, 3),
        "error": None if same else "the object read back differs from the one written",
    }


def _verify(store: S3CheckpointStore | FsCheckpointStore, manifest: CheckpointManifest) -> list[str] | None:
    """The checkpoint's problems, or None when it was deleted while being checked: the writer prunes
    its oldest checkpoints (manifest first), which is retention, not corruption."""
    problems = store.verify(manifest)
    if problems and store.manifest((manifest.job, manifest.restart, manifest.step)) is None:
        return None
    return problems


def checkpoints_intact(
    which: str = "checkpoint", configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Every complete checkpoint where the checkpoints live (the checkpoint bucket, or the JuiceFS
    mount's folder when the stack checkpoints there) or of the backup bucket, verified by sha256
    against its manifest: {"status": "intact" | "corrupt", "complete", "verified", "corrupt": [...],
    "incomplete": [...]}; tolerate with `{"type": "regex", "target": "status", "pattern": "^intact$"}`
    (incomplete checkpoints, saves cut off, are reported and not counted as corrupt)."""
    state = _storage(configuration)
    if which not in ("checkpoint", "backup"):
        raise ActivityFailed(f"which must be checkpoint or backup, not {which!r}")
    store: S3CheckpointStore | FsCheckpointStore
    if which == "checkpoint":
        store = checkpoint_store_of(state)
    else:
        assert state.backup_bucket is not None
        store = store_for(state, state.backup_bucket, BACKUP_PREFIX)
    where = str(store.root) if isinstance(store, FsCheckpointStore) else store.bucket
    corrupt, incomplete, verified, complete, pruned = [], [], 0, 0, 0
    for c in store.candidates():
        if c.manifest is None:
            incomplete.append(stem(c.key))
            continue
        complete += 1
        problems = _verify(store, c.manifest)
        if problems is None:
            pruned += 1
        elif problems:
            corrupt.append({"checkpoint": stem(c.key), "problems": problems})
        else:
            verified += 1
    return {
        "bucket": where,  # or the mount's folder
        "complete": complete,
        "verified": verified,
        "pruned_while_checked": pruned,
        "status": "corrupt" if corrupt else "intact",
        "corrupt": corrupt,
        "incomplete": incomplete,
    }


DRILL_FAULTS = frozenset({"bucket-loss", "osd-kill", "metadata-engine-loss"})


def _targets(ctx: engine.Context) -> DrTargets | None:
    dr = ctx.stack.dr if ctx.stack is not None else None
    return DrTargets(dr.rpo_seconds, dr.rto_seconds) if dr is not None else None


def _osd_lost(
    drill: str, ctx: engine.Context, state: StorageSandboxState, failed_at: float, timeout_s: float
) -> dict[str, Any]:
    """Drill "an OSD lost for good": recovery is Ceph re-replicating its data onto the other OSDs
    (every PG active+clean while the OSD stays out), then every checkpoint verified by sha256. RPO:
    the age at the failure of the newest checkpoint that verifies afterwards; RTO: the failure to
    all PGs clean with every checkpoint verified."""
    problems: list[str] = []
    deadline = time.monotonic() + timeout_s
    clean = False
    while time.monotonic() < deadline:
        try:
            clean = bool(_health(state)["pgs_clean"])
        except ActivityFailed as e:
            problems.append(f"ceph did not answer: {e}")
        if clean:
            break
        time.sleep(1.0)
    if not clean:
        problems.append(f"placement groups not all active+clean {timeout_s:g} s after the probe started")
    assert state.checkpoint_bucket is not None
    store = store_for(state, state.checkpoint_bucket)
    corrupt, verified = 0, []
    for c in store.candidates():
        if c.manifest is None:
            continue
        found = _verify(store, c.manifest)
        if found:
            corrupt += 1
        elif found is not None:
            verified.append(c)
    done_at = time.time() if clean else None
    before = [(c.key, c.manifest.written_at) for c in verified
              if c.manifest is not None and c.manifest.written_at <= failed_at]
    checked = len(verified)
    job = job_drill.job_on_bucket(state, _state_root(ctx))
    if job is not None:
        # The training job checkpoints straight to the bucket (ADR 0070): its checkpoints are
        # verified with the writer's. It keeps only its newest few, so by the time the PGs are clean
        # it has usually pruned every one written before the failure (retention, not loss): the
        # RPO is the newest checkpoint of either written before the failure that verifies now.
        good, bad = job.reader.verify_all()
        corrupt += len(bad)
        checked += len(good)
        problems += [f"{k.stem} of the training job does not verify: {why}" for k, why in bad]
        job_before = [((g.key.job, g.key.restart, g.key.step), g.manifest.written_at) for g in good
                      if g.manifest.written_at <= failed_at]
        before += job_before
        problems.append(f"{len(good)} checkpoint(s) of the training job ({job.folder}) and {len(verified)} "
                        f"of the checkpoint writer verified after the recovery; {len(job_before)} of the "
                        "job's written before the failure (it prunes to its newest few)")
    newest = max(before, key=lambda b: b[1], default=None)
    if newest is None:
        problems.append("no checkpoint written before the failure is left to verify")
    restored = None
    if newest is not None:
        restored = RestoredCheckpoint(stem(newest[0]), newest[0][2], newest[1], True)
    verdict = judge_drill(
        DrillInputs(
            drill=drill,
            targets=_targets(ctx),
            failed_at=failed_at,
            restore_verified_at=done_at,
            restored=restored,
            checkpoints_restored=checked,
            checkpoints_corrupt=corrupt,
            problems=tuple(problems),
        )
    )
    doc = verdict.to_doc()
    logger.info("gpufleet drill verdict: %s", json.dumps(doc, default=str))
    return doc


def _writer_resumed(state: StorageSandboxState, after: float, timeout_s: float) -> float | None:
    """When the checkpoint writer first saved again, or resumed from a checkpoint, after `after`
    (waiting up to `timeout_s`). A writer whose calls only blocked while the metadata engine was
    gone (JuiceFS retries the engine) never restarts: its first save on the restored mount is when
    it went on."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = read_objects(state.events_file("checkpoint-writer"))
        resumed = [
            e for e in events if e.get("event") in ("resume", "checkpoint") and float(e["t"]) > after
        ]
        if resumed:
            return float(resumed[0]["t"])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def _newest_saved_before(state: StorageSandboxState, failed_at: float) -> RestoredCheckpoint | None:
    writer = state.events_file("checkpoint-writer")
    before = [e for e in read_objects(writer) if e.get("event") == "checkpoint" and float(e["t"]) < failed_at]
    if not before:
        return None
    b = max(before, key=lambda e: int(e["step"]))
    return RestoredCheckpoint(f"step {b['step']}", int(b["step"]), float(b["written_at"]), True)


def _gc_note(gc: dict[str, Any] | None) -> str:
    """The restore's `juicefs gc` (storage_undo._collect_leaks) said in the drill's evidence."""
    if not gc:
        return "juicefs gc after the restore: not run"
    if gc.get("error"):
        return f"juicefs gc after the restore failed: {gc['error']}"
    return (
        f"juicefs gc after the restore: {gc['leaked_found']} leaked object(s) ({gc['leaked_bytes']} "
        f"bytes) found, {gc['deleted']} deleted, {gc['leaked_after']} left, in {gc['seconds']} s"
    )


def _judge_job(
    drill: str,
    ctx: engine.Context,
    state: StorageSandboxState,
    job: job_drill.JobStore,
    failed_at: float,
    restore: dict[str, Any] | None,
    timeout_s: float,
    problems: list[str],
    writer: tuple[int, int],
) -> dict[str, Any]:
    """The verdict on the training job; the checkpoint writer beside it is only reported."""
    writer_at = _writer_resumed(state, failed_at, 0.0) if restore is not None else None
    problems.append("the checkpoint writer beside it: " + (
        "no save since the failure" if writer_at is None
        else f"saved again {writer_at - failed_at:.1f} s after the failure"))
    inputs = job_drill.judge_job(drill, _targets(ctx), job, failed_at, restore, timeout_s, problems, writer)
    doc = judge_drill(inputs).to_doc()
    logger.info("gpufleet drill verdict: %s", json.dumps(doc, default=str))
    return doc


def _metadata_lost(
    drill: str, ctx: engine.Context, state: StorageSandboxState, failed_at: float, timeout_s: float
) -> dict[str, Any]:
    """Drill "metadata engine lost": the restore (storage_undo.rb_restore_metadata) loaded the newest
    verified `juicefs dump` and mounted again, verifying every checkpoint on the mount. RPO: the age
    at the failure of the newest checkpoint on the restored mount, verified again here by sha256;
    RTO: the failure to the restore's end with every checkpoint verified; and when the writer
    resumed from it."""
    problems: list[str] = []
    restores = [
        e for e in read_objects(state.events_file("metadata-restore")) if float(e.get("t", 0)) >= failed_at
    ]
    restore = restores[-1] if restores else None
    loaded = (restore or {}).get("loaded")
    if restore is None:
        problems.append("no metadata restore was recorded after the fault")
    elif loaded is None:
        problems.append("the engine still held the volume: no dump was loaded")
    else:
        problems.append(f"restored from {loaded['dump']} ({failed_at - float(loaded['taken_at']):.1f} s "
                        f"before the failure; {loaded['files']} files, {loaded['inodes']} inodes)")
        problems.append(_gc_note((restore or {}).get("gc")))
    rec = state.juicefs
    if rec is None or rec.checkpoint_dir is None:
        raise ActivityFailed(f"the storage sandbox of {state.stack} has no checkpoints on JuiceFS")
    job = job_drill.job_on_volume(state, _state_root(ctx))
    if job is not None:
        # The real training job checkpoints on the volume: it is what the drill judges.
        writer = (len((restore or {}).get("verified", [])), len((restore or {}).get("corrupt", [])))
        return _judge_job(drill, ctx, state, job, failed_at, restore, timeout_s, problems, writer)
    store = FsCheckpointStore(Path(rec.checkpoint_dir))
    came_back = [r for r in (restore or {}).get("verified", []) if float(r["written_at"]) <= failed_at]
    corrupt = len((restore or {}).get("corrupt", []))
    restored = None
    if came_back:
        # The oracle: the newest restored checkpoint as the mount holds it now, every file by sha256.
        newest = max(came_back, key=lambda r: tuple(r["key"]))
        key = (int(newest["key"][0]), int(newest["key"][1]), int(newest["key"][2]))
        m = store.manifest(key)
        why = m if isinstance(m, str) else ("" if m is None else "; ".join(store.verify(m)))
        if m is None:
            problems.append(f"{stem(key)} was pruned by the writer before this check (restore-verified)")
        restored = RestoredCheckpoint(stem(key), key[2], float(newest["written_at"]), not why, why or None)
        corrupt += 1 if why else 0
    verdict = judge_drill(
        DrillInputs(
            drill=drill,
            targets=_targets(ctx),
            failed_at=failed_at,
            restore_verified_at=None if restore is None or restore.get("corrupt") else float(restore["t"]),
            restored=restored,
            newest_before_failure=_newest_saved_before(state, failed_at),
            checkpoints_restored=len(came_back),
            checkpoints_corrupt=corrupt,
            workload_resumed_at=_writer_resumed(state, failed_at, timeout_s) if restore is not None else None,
            problems=tuple(problems),
        )
    )
    doc = verdict.to_doc()
    logger.info("gpufleet drill verdict: %s", json.dumps(doc, default=str))
    return doc


def drill_within_targets(
    drill: str = "checkpoint-bucket-lost",
    resume_timeout_seconds: float = 30.0,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """The drill's verdict (gpufleet.slo.dr.judge_drill) against the stack's `dr` targets, from this
    run's bucket-loss fault in the ledger (when it failed), the restore's record (what came back,
    when it was verified), the checkpoint bucket verified again now, and the checkpoint writer's
    events (what it had saved before, when it resumed). Declare it with tolerance
    `{"type": "regex", "target": "outcome", "pattern": "^PASS$"}`. Before the fault (the hypothesis
    before the method) there is nothing to judge: outcome PASS, said in the output."""
    ctx = engine.context(configuration)
    state = _storage(configuration)
    faults = [r for r in ctx.ledger.records() if r.run_id == ctx.run.run_id and r.kind in DRILL_FAULTS]
    if not faults:
        return {"outcome": "PASS", "before_fault": True, "notes": ["no drill fault of this run yet"]}
    if faults[-1].kind == "osd-kill":
        return _osd_lost(drill, ctx, state, faults[-1].at, resume_timeout_seconds)
    if faults[-1].kind == "metadata-engine-loss":
        return _metadata_lost(drill, ctx, state, faults[-1].at, resume_timeout_seconds)
    failed_at = faults[-1].at
    problems: list[str] = []
    restores = [e for e in read_objects(state.events_file("restore")) if float(e.get("t", 0)) >= failed_at]
    restore = restores[-1] if restores else None
    if restore is None:
        problems.append("no restore was recorded after the fault")
    job = job_drill.job_on_bucket(state, _state_root(ctx))
    if job is not None:
        # The real training job checkpoints straight to the bucket (ADR 0070): the drill judges it.
        counts = (len((restore or {}).get("restored", [])), len((restore or {}).get("failed", [])))
        timeout = resume_timeout_seconds
        return _judge_job(drill, ctx, state, job, failed_at, restore, timeout, problems, counts)
    writer = state.events_file("checkpoint-writer")
    deadline = time.monotonic() + resume_timeout_seconds
    resumed_at = None
    while restore is not None and resumed_at is None and time.monotonic() < deadline:
        events = read_objects(writer)
        resumed = [e for e in events if e.get("event") == "resume" and float(e["t"]) > failed_at]
        resumed_at = float(resumed[0]["t"]) if resumed else None
        if resumed_at is None:
            time.sleep(0.5)
    assert state.checkpoint_bucket is not None
    primary = store_for(state, state.checkpoint_bucket)
    came_back = (restore or {}).get("restored", [])
    restored = None
    corrupt = len((restore or {}).get("failed", []))
    pruned = 0
    for r in came_back:
        # The oracle: each restored checkpoint as the bucket holds it now, every file by sha256. One
        # that is gone entirely was pruned since by the writer's retention (it keeps its newest 20),
        # which is not corruption: the restore verified it when it copied it back.
        key = (int(r["key"][0]), int(r["key"][1]), int(r["key"][2]))
        m = primary.manifest(key)
        why = m if isinstance(m, str) else ("" if m is None else "; ".join(primary.verify(m)))
        if m is None:
            pruned += 1
        if why:
            corrupt += 1
        if restored is None or stem(key) > restored.name:  # stems sort as (job, restart, step)
            restored = RestoredCheckpoint(stem(key), key[2], float(r["written_at"]), not why, why or None)
    if pruned:
        problems.append(
            f"{pruned} restored checkpoint(s) pruned by the writer's retention before this check "
            "(verified by the restore itself)"
        )
    before = [e for e in read_objects(writer) if e.get("event") == "checkpoint" and float(e["t"]) < failed_at]
    newest_before = None
    if before:
        b = max(before, key=lambda e: int(e["step"]))
        newest_before = RestoredCheckpoint(f"step {b['step']}", int(b["step"]), float(b["written_at"]), True)
    dr = ctx.stack.dr if ctx.stack is not None else None
    verdict = judge_drill(
        DrillInputs(
            drill=drill,
            targets=DrTargets(dr.rpo_seconds, dr.rto_seconds) if dr is not None else None,
            failed_at=failed_at,
            restore_verified_at=float(restore["t"])
            if restore is not None and not restore.get("failed")
            else None,
            restored=restored,
            newest_before_failure=newest_before,
            checkpoints_restored=len(came_back),
            checkpoints_corrupt=corrupt,
            workload_resumed_at=resumed_at,
            problems=tuple(problems),
        )
    )
    doc = verdict.to_doc()
    logger.info("gpufleet drill verdict: %s", json.dumps(doc, default=str))
    return doc


def thrash_within_limits(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """The verdict of this run's OSD thrash (action osd_thrash): {"outcome": "PASS" | "FAIL",
    "problems", "time_to_clean_s", "oracle", "checkpoints", ...}, the report the thrasher wrote into
    the storage sandbox's `osd-thrash` events. PASS only with 0 oracle mismatches, 0 S3 errors
    unaccounted for, 0 checkpoints lost or corrupt, every change's PGs active again and the cluster
    clean at the end. Before the thrash ran (the hypothesis before the method): PASS, said in the
    output. Tolerance: `{"type": "regex", "target": "outcome", "pattern": "^PASS$"}`."""
    from gpufleet.chaos.storage.thrash import latest_report

    ctx = engine.context(configuration)
    state = _storage(configuration)
    report = latest_report(state, ctx.run.run_id)
    if report is None:
        if any(r.kind == "osd-thrash" for r in ctx.ledger.records() if r.run_id == ctx.run.run_id):
            return {"outcome": "FAIL", "problems": ["the thrash of this run started and wrote no report"]}
        return {"outcome": "PASS", "before_fault": True, "notes": ["no OSD thrash in this run yet"]}
    logger.info("gpufleet thrash verdict: %s", json.dumps(report, default=str))
    return report
