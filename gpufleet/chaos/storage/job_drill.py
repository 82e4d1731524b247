"""Storage drills judged on the real training job, when one checkpoints on the storage sandbox.

A Slurm sandbox of the same stack runs its PyTorch training job with its checkpoints in a folder of
the JuiceFS volume (`storage.checkpoint.location` juicefs://, ADR 0068; drill metadata-engine-lost)
or in a prefix of the checkpoint bucket (s3://, ADR 0070; drill checkpoint-bucket-lost). The drill
then judges that job instead of the storage sandbox's checkpoint writer, which stands in for a job
only when none runs:
- RPO: the age at the failure of the newest checkpoint of the job that the restore brought back,
  verified by sha256 (by the restore, and again here while the job has not pruned it);
- RTO: the failure to the job's first training step logged after the restore ended verified (the
  issue's "fault to the first new training step");
- integrity: every checkpoint of the job and of the writer the restore brought back, verified by
  sha256 (storage_undo's restores record the job's as `job_verified`/`job_corrupt`);
- steps lost: the newest checkpoint the job saved before the failure minus the restored one (the
  checkpoints the restore could not bring back, in steps).
The decision is `job_inputs` (pure); `judge_job` reads the artefacts and waits for the step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.core.job_checkpoints import CheckpointReader, CkptKey, JobCheckpoints
from gpufleet.core.jsonl import read_objects
from gpufleet.core.s3 import read_location
from gpufleet.core.s3_job_checkpoints import reader_for
from gpufleet.core.sandbox_contract import SandboxState, read_state, state_path
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.slo.dr import DrillInputs, DrTargets, RestoredCheckpoint


def _first_step_after(events: Sequence[dict[str, Any]], after: float) -> dict[str, Any] | None:
    later = [e for e in events if e.get("event") == "step" and float(e.get("t", 0)) > after]
    return min(later, key=lambda e: float(e["t"])) if later else None


def job_inputs(
    drill: str,
    targets: DrTargets | None,
    failed_at: float,
    restore: dict[str, Any] | None,
    folder: str,
    events: Sequence[dict[str, Any]],
    recheck: dict[str, str | None],
    notes: Sequence[str] = (),
    writer: tuple[int, int] = (0, 0),
) -> DrillInputs:
    """The drill's inputs from the restore's record, the job's events and the re-check of the
    newest restored checkpoint (`recheck`: its stem -> None when it verified again, the problem
    when it did not, or absent when the job had pruned it). `writer`: the checkpoint writer's
    checkpoints the same restore brought back verified, and the ones that did not verify."""
    problems = list(notes)
    mine = [r for r in (restore or {}).get("job_verified", []) if r.get("folder") == folder]
    bad = [r for r in (restore or {}).get("job_corrupt", []) if r.get("folder") == folder]
    writer_ok, writer_bad = writer
    came_back = [r for r in mine if float(r["written_at"]) <= failed_at]
    restored = None
    if came_back:
        newest = max(came_back, key=lambda r: tuple(r["key"]))
        name = str(newest["checkpoint"])
        why = recheck.get(name)
        if name not in recheck:
            problems.append(f"{name} was pruned by the training job before this check (restore-verified)")
        restored = RestoredCheckpoint(name, int(newest["step"]), float(newest["written_at"]), not why, why)
    elif restore is not None:
        problems.append(f"no checkpoint of the training job ({folder}) written before the failure came back")
    saved = [e for e in events if e.get("event") == "checkpoint" and float(e.get("t", 0)) < failed_at]
    newest_before = None
    if saved:
        b = max(saved, key=lambda e: int(e.get("step") or 0))
        newest_before = RestoredCheckpoint(str(b.get("checkpoint", f"step {b.get('step')}")),
                                           int(b.get("step") or 0), float(b["t"]), True)
    first = _first_step_after(events, float(restore["t"])) if restore is not None else None
    if restore is not None and first is None:
        problems.append("the training job logged no step after the restore")
    restarts = [e for e in events if e.get("event") == "resume" and float(e.get("t", 0)) > failed_at]
    if restarts:
        r0 = restarts[0]
        problems.append(f"the training job restarted (job {r0.get('job_id')}) from {r0.get('checkpoint')}")
    elif first is not None:
        problems.append("the training job kept running: its saves failed or waited while the store was gone")
    verified_at = first["t"] if first is not None and not bad and not writer_bad else None
    return DrillInputs(
        drill=drill,
        targets=targets,
        failed_at=failed_at,
        restore_verified_at=None if verified_at is None else float(verified_at),
        restored=restored,
        newest_before_failure=newest_before,
        checkpoints_restored=len(mine) + writer_ok,
        checkpoints_corrupt=len(bad) + writer_bad + int(restored is not None and not restored.verified),
        workload_resumed_at=None if first is None else float(first["t"]),
        problems=tuple(problems),
        integrity_detail=(
            f"{len(mine)} checkpoint(s) of the training job ({folder}) and {writer_ok} of the checkpoint "
            f"writer restored, every file verified by sha256"
            if not bad and not writer_bad and restored is not None and restored.verified
            else f"{len(bad) + writer_bad} restored checkpoint(s) do not verify: "
            f"{[r.get('checkpoint') for r in bad]}"
        ),
    )


def recheck_newest(reader: CheckpointReader, folder: str, restore: dict[str, Any] | None,
                   failed_at: float) -> dict[str, str | None]:
    """The newest restored checkpoint of the job as its store holds it now, by sha256 (the oracle);
    empty when the job has pruned it since."""
    mine = [r for r in (restore or {}).get("job_verified", []) if r.get("folder") == folder
            and float(r["written_at"]) <= failed_at]
    if not mine:
        return {}
    newest = max(mine, key=lambda r: tuple(r["key"]))
    return reader.recheck(CkptKey(*(int(k) for k in newest["key"])))


@dataclass(frozen=True)
class JobStore:
    """Where a training job's checkpoints are, as a drill reads them."""

    reader: CheckpointReader
    folder: str  # the job's folder (or prefix) name, `job-<run id>`, as the restore records it
    events_file: Path


def job_on_volume(state: StorageSandboxState, root: Path | None) -> JobStore | None:
    """The stack's Slurm sandbox's training job when it checkpoints in a folder of this volume."""
    rec = state.juicefs
    sandbox = _sandbox(state, root)
    if rec is None or rec.checkpoint_dir is None or sandbox is None or sandbox.checkpoint_s3 is not None:
        return None
    assert sandbox.checkpoint_dir is not None and sandbox.training_events is not None
    folder = Path(sandbox.checkpoint_dir)
    if folder.parent != Path(rec.checkpoint_dir):
        return None
    return JobStore(JobCheckpoints(folder), folder.name, Path(sandbox.training_events))


def job_on_bucket(state: StorageSandboxState, root: Path | None) -> JobStore | None:
    """The stack's Slurm sandbox's training job when it checkpoints straight to this storage
    sandbox's checkpoint bucket (ADR 0070), read through radosgw's own address."""
    sandbox = _sandbox(state, root)
    if sandbox is None or sandbox.checkpoint_s3 is None or state.s3_endpoint is None:
        return None
    assert sandbox.training_events is not None
    try:
        loc = read_location(Path(sandbox.checkpoint_s3))
    except (OSError, ValueError):
        return None
    if loc.bucket != state.checkpoint_bucket:
        return None
    folder = loc.prefix.rstrip("/").rsplit("/", 1)[-1]
    return JobStore(reader_for(loc, endpoint=state.s3_endpoint), folder, Path(sandbox.training_events))


def _sandbox(state: StorageSandboxState, root: Path | None) -> SandboxState | None:
    if not state_path(state.stack, root).exists():
        return None
    try:
        sandbox = read_state(state.stack, root)
    except (OSError, ValueError):
        return None
    if sandbox.checkpoint_dir is None or sandbox.training_events is None:
        return None
    return sandbox


def judge_job(
    drill: str,
    targets: DrTargets | None,
    job: JobStore,
    failed_at: float,
    restore: dict[str, Any] | None,
    timeout_s: float,
    notes: Sequence[str],
    writer: tuple[int, int],
) -> DrillInputs:
    """Read the job's artefacts (waiting up to `timeout_s` for its first step after the restore)."""
    recheck = recheck_newest(job.reader, job.folder, restore, failed_at)
    deadline = time.monotonic() + timeout_s
    events = read_objects(job.events_file)
    while restore is not None and _first_step_after(events, float(restore["t"])) is None:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
        events = read_objects(job.events_file)
    return job_inputs(drill, targets, failed_at, restore, job.folder, events, recheck, notes, writer)
