"""Drill "scheduler state lost" on the Slurm sandbox (docs/storage.md, issue 14's drill 3): actions
(queued jobs, waiting for a verified state backup, the fault, the restore) and the verdict probe.

The verdict (`drill_within_targets`, judged once by gpufleet.slo.dr.judge_drill, ADR 0042):
- RPO: the age at the failure of the state backup the restore loaded (what was lost is what the
  controller learnt after it: the jobs submitted since, listed in the notes);
- RTO: the failure to the training job's first new step after slurmctld answered again with the
  restored state;
- integrity: every job of the backup that was still active at the failure came back (same JobId),
  the training job among them, running.
Beside them: the training steps lost (the newest step before the failure minus the step the job
went on from) and how many steps ran while the controller was gone (slurmd keeps a job's steps).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import SlurmStateLoss
from gpufleet.chaos import engine, sysops
from gpufleet.chaos.backends.sandbox import SandboxBackend
from gpufleet.chaos.backends.slurm_state_fault import RECORD
from gpufleet.core.jsonl import append_objects, read_objects
from gpufleet.core.sandbox_contract import SandboxState
from gpufleet.core.slurm_backup_checks import JobEntry, StateBackupEvidence, jobs_back
from gpufleet.core.slurm_state_backups import backup_dir, list_evidence, live_jobs
from gpufleet.core.slurm_state_offsite import list_offsite, offsite_for
from gpufleet.core.training_events import TrainingEvent, read_events
from gpufleet.slo.dr import DrillInputs, DrTargets, RestoredCheckpoint, judge_drill

__all__ = [
    "cancel_drill_jobs",
    "drill_within_targets",
    "restore_scheduler_state",
    "slurm_state_loss",
    "submit_queued_jobs",
    "wait_for_backup",
]

logger = logging.getLogger("chaostoolkit")
QUEUED_PREFIX = "gpufleet-drill-queued-"
ACTIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
DRILL_RECORD = "scheduler-drill.jsonl"  # under <run>/slurm/: the jobs the drill submitted
TraceStep = tuple[list[TrainingEvent], TrainingEvent | None]  # every step event, the first new one


def _state(configuration: Configuration) -> SandboxState:
    backend = engine.context(configuration).backend()
    if not isinstance(backend, SandboxBackend):
        raise ActivityFailed("the scheduler drill runs on the Slurm sandbox (gpufleet_backend: sandbox)")
    return backend.state


def _slurm_dir(state: SandboxState) -> Path:
    return Path(state.base_dir) / "slurm"


def submit_queued_jobs(
    count: int = 2, after_backup: bool = False, configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Submit `count` held jobs (they stay PENDING, reason JobHeldUser, whatever the free nodes):
    the queued jobs the drill expects back. `after_backup`: jobs the drill expects lost (submitted
    after the backup the restore will load)."""
    state = _state(configuration)
    ids = []
    for i in range(count):
        name = f"{QUEUED_PREFIX}{'late-' if after_backup else ''}{i}"
        out = sysops.run(state.slurm_command("sbatch", "--parsable", "--hold", "-J", name, "-N", "1",
                                             "-o", "/dev/null", "--wrap", "/bin/sleep 3600"))
        ids.append(out.strip().split(";")[0])
    append_objects(_slurm_dir(state) / DRILL_RECORD,
                   [{"t": time.time(), "event": "after_backup" if after_backup else "queued", "jobs": ids}])
    return {"submitted": ids, "after_backup": after_backup}


def wait_for_backup(
    timeout_seconds: float = 60.0,
    offsite: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Wait for a verified state backup holding every job the controller lists now (the training
    job and the queued ones): the backup the restore will load. With `offsite`, its copy in the
    storage sandbox's backup bucket (core.slurm_state_offsite), which a lost controller host leaves."""
    state = _state(configuration)
    want = {j.id for j in live_jobs(state) or [] if j.state in ACTIVE}
    since = time.time()
    target = None
    if offsite:
        backend = engine.context(configuration).backend()
        assert isinstance(backend, SandboxBackend)
        target = offsite_for(state.stack, backend.state_root)
        if target is None:
            raise ActivityFailed("offsite: the stack's storage sandbox (its backup bucket) is not up")
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        found = list_offsite(*target) if target is not None else list_evidence(backup_dir(state))
        for e in reversed(found):
            if e.verified and e.taken_at >= since and want <= e.job_ids():
                return {"backup": e.archive, "jobs": sorted(e.job_ids()), "load_seconds": e.load_seconds,
                        "where": "backup bucket" if offsite else "host"}
        time.sleep(0.5)
    where = "in the backup bucket" if offsite else f"in {backup_dir(state)}"
    raise ActivityFailed(f"no verified state backup holding jobs {sorted(want)} {where} within "
                         f"{timeout_seconds:g} s (see {_slurm_dir(state) / 'state-backup.jsonl'})")


def slurm_state_loss(
    fault_id: str = "scheduler-state-loss",
    scope: str = "state-dir",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """`scope`: state-dir (the state directory lost) or controller-host (with the host's backups)."""
    return engine.inject(configuration, SlurmStateLoss.model_validate({"scope": scope}), fault_id)


def restore_scheduler_state(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Undo the slurm-state-loss faults still in the ledger: restore the newest verified state backup
    and start slurmctld again (slurm_state_fault.rb_slurm_state_restore)."""
    return engine.revert_summary(engine.revert(configuration, {"slurm-state-loss"}))


def cancel_drill_jobs(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Cancel the jobs the drill submitted (its own; the training job is left alone)."""
    state = _state(configuration)
    mine = [j.id for j in live_jobs(state) or [] if j.name.startswith(QUEUED_PREFIX) and j.state in ACTIVE]
    if mine:
        sysops.run(state.slurm_command("scancel", *mine), check=False)
    return {"cancelled": mine}


# ----------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Observed:
    """What the probe read, all from real artefacts (the ledger, the fault's and restore's records,
    the controller's squeue now, the training job's events)."""

    failed_at: float
    jobs_before: list[JobEntry]  # the live controller's jobs just before the fault
    restore: dict[str, Any] | None  # the rollback's `state_restored` record
    backup: StateBackupEvidence | None  # the evidence of the backup it loaded
    jobs_now: list[JobEntry] | None  # squeue after the restore (None: no answer)
    training_job: str | None  # the training job's name
    steps: list[TrainingEvent]  # the training job's step events
    first_new_step: TrainingEvent | None  # the first step after the controller answered again
    submitted_after_backup: list[str]


def drill_inputs(drill: str, targets: DrTargets | None, o: Observed) -> DrillInputs:
    """The judge's inputs from what was observed (pure)."""
    problems: list[str] = []
    active_before = [j for j in o.jobs_before if j.state in ACTIVE]
    answered_at = float(o.restore["t"]) if o.restore else None
    if o.restore is None:
        problems.append("no restore of slurmctld's state was recorded after the fault")
    elif o.restore.get("backup") is None:
        problems.append("the restore loaded no backup (the state moved aside was put back)")
    elif o.restore.get("from") == "backup bucket":
        problems.append(f"restored from the off-host copy of {o.restore['backup']} in the backup bucket "
                        "(the host's own backups were lost with it)")
    in_backup = o.backup.job_ids() if o.backup else set()
    expected = [j.id for j in active_before if j.id in in_backup]
    lost_by_rpo = [j.id for j in active_before if j.id not in in_backup]
    if lost_by_rpo:
        late = f"; the drill submitted {', '.join(o.submitted_after_backup)} after it" if (
            o.submitted_after_backup) else ""
        problems.append(f"jobs submitted after the backup, lost with the state (RPO): "
                        f"{', '.join(lost_by_rpo)}{late}")
    back, missing = jobs_back(expected, o.jobs_now or [])
    train = next((j for j in active_before if j.name == o.training_job), None)
    train_now = next((j for j in o.jobs_now or [] if train is not None and j.id == train.id), None)
    if train is None:
        problems.append("the training job was not running before the fault")
    elif train_now is None or train_now.state != "RUNNING":
        missing = sorted(set(missing) | {train.id})
        problems.append(f"the training job {train.id} is not running after the restore "
                        f"({train_now.state if train_now else 'gone'})")
    before = [s for s in o.steps if s.t < o.failed_at and s.step is not None]
    newest_before = max(before, key=lambda s: (s.t, s.step or 0), default=None)
    during = [s for s in o.steps if answered_at is not None and o.failed_at <= s.t < answered_at]
    if during:
        problems.append(f"{len(during)} training steps ran while slurmctld was down: slurmd kept the job's "
                        "step")
    restored = None
    first = o.first_new_step
    if o.backup is not None:
        went_on_from = (first.step or 1) - 1 if first is not None else 0
        why = f"jobs that did not come back: {', '.join(missing)}" if missing else None
        restored = RestoredCheckpoint(o.backup.archive, went_on_from, o.backup.taken_at, not missing, why)
    resumed_at = first.t if first is not None else None
    return DrillInputs(
        drill=drill,
        targets=targets,
        failed_at=o.failed_at,
        restore_verified_at=resumed_at if o.restore is not None and not missing else None,
        restored=restored,
        newest_before_failure=None if newest_before is None else RestoredCheckpoint(
            f"step {newest_before.step}", newest_before.step or 0, newest_before.t, True),
        checkpoints_restored=len(back),
        checkpoints_corrupt=len(missing),
        workload_resumed_at=resumed_at,
        problems=tuple(problems),
        integrity_detail=(f"{len(back)} job(s) of the backup back with the same JobId"
                          + (f", {len(missing)} not: {', '.join(missing)}" if missing else
                             ", the training job running")),
    )


def _targets(ctx: engine.Context) -> DrTargets | None:
    dr = ctx.stack.dr if ctx.stack is not None else None
    return DrTargets(dr.rpo_seconds, dr.rto_seconds) if dr is not None else None


def _first_step_after(state: SandboxState, job: str | None, after: float, timeout_s: float) -> TraceStep:
    deadline = time.monotonic() + timeout_s
    while True:
        steps = [e for e in read_events(state.training_events or "") if e.event == "step"]
        new = [e for e in steps if e.t > after and (job is None or str(e.job_id) == job)]
        if new or time.monotonic() >= deadline:
            return steps, min(new, key=lambda e: e.t, default=None)
        time.sleep(0.5)


def drill_within_targets(
    drill: str = "scheduler-state-lost",
    resume_timeout_seconds: float = 60.0,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """The drill's verdict against the stack's `dr` targets. Declare it with tolerance
    `{"type": "regex", "target": "outcome", "pattern": "^PASS$"}`. Before the fault (the hypothesis
    before the method) there is nothing to judge: outcome PASS, said in the output."""
    ctx = engine.context(configuration)
    state = _state(configuration)
    faults = [r for r in ctx.ledger.records() if r.run_id == ctx.run.run_id and r.kind == "slurm-state-loss"]
    if not faults:
        return {"outcome": "PASS", "before_fault": True, "notes": ["no slurm-state-loss of this run yet"]}
    failed_at = faults[-1].at
    records = [r for r in read_objects(_slurm_dir(state) / RECORD) if float(r.get("t", 0)) >= failed_at]
    lost = next((r for r in records if r.get("event") == "state_lost"), {})
    restore = next((r for r in reversed(records) if r.get("event") == "state_restored"), None)
    backup = None
    if restore is not None and restore.get("backup"):
        backup = next((e for e in list_evidence(backup_dir(state)) if e.archive == restore["backup"]), None)
    jobs_before = [JobEntry.model_validate(j) for j in lost.get("jobs", [])]
    train = next((j.id for j in jobs_before if j.name == state.training_job_name), None)
    steps: list[TrainingEvent] = []
    first: TrainingEvent | None = None
    if restore is not None:
        steps, first = _first_step_after(state, train, float(restore["t"]), resume_timeout_seconds)
    drilled = read_objects(_slurm_dir(state) / DRILL_RECORD)
    late = [j for r in drilled if r.get("event") == "after_backup" for j in r.get("jobs", [])]
    observed = Observed(failed_at, jobs_before, restore, backup, live_jobs(state), state.training_job_name,
                        steps, first, late)
    verdict = judge_drill(drill_inputs(drill, _targets(ctx), observed))
    doc = verdict.to_doc()
    logger.info("gpufleet drill verdict: %s", json.dumps(doc, default=str))
    return doc
