"""What makes a copy of Slurm's StateSaveLocation a backup, and which one a restore takes (pure).

A backup is verified when (core.slurm_state_backups does the I/O):
- a scratch slurmctld (its own configuration and port, the copy as its StateSaveLocation) started
  on it and answered `squeue` (a state file Slurm cannot read stops slurmctld without `-i`);
- every job the live controller listed both just before and just after the copy is in it (the copy
  is taken once the controller has saved every job it lists: see wait_saved in the I/O module);
- its job count did not shrink sharply against the previous verified backup (backup_checks'
  floor, shared with the JuiceFS metadata dumps). Counts include ended jobs, which slurmctld keeps
  in its state for MinJobAge (slurm.conf(5)), so jobs finishing do not look like a shrink.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from gpufleet.core import backup_checks

ARCHIVE_PREFIX = "slurm-state-"
ARCHIVE_SUFFIX = ".tar.gz"
EVIDENCE_SUFFIX = ".evidence.json"
# `squeue -h -t all -o` format: id, name, state, submit time (ISO, squeue(1) %V).
SQUEUE_FORMAT = "%i|%j|%T|%V"
# Keys the scratch controller's slurm.conf must replace (slurm.conf(5)); the rest is the live one.
SCRATCH_KEYS = ("SlurmctldPort", "SlurmdPort", "StateSaveLocation", "SlurmctldPidFile", "SlurmctldLogFile")


class JobEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    state: str
    submitted: str = ""  # squeue's %V, e.g. 2026-12-05T05:10:11


class StateBackupEvidence(BaseModel):
    """What one backup of slurmctld's state proved, kept beside its archive."""

    model_config = ConfigDict(extra="forbid")

    archive: str  # file name in the backup directory
    taken_at: float  # when the controller was paused for the copy (wall clock)
    seconds: float  # wait for the save, copy, archive, scratch load, checks
    paused_seconds: float  # how long slurmctld was stopped (SIGSTOP) for the copy
    bytes: int  # of the archive
    files: int  # in the copied state directory
    sha256: str  # of the archive
    verified: bool
    jobs: list[JobEntry] = []  # as the scratch slurmctld listed them from the backup
    live_before: list[str] = []  # job ids the live controller listed before the copy
    live_after: list[str] = []  # and after it
    load_seconds: float | None = None  # scratch slurmctld start to its first squeue answer
    previous: str | None = None  # the previous verified backup compared with
    previous_jobs: int | None = None
    problems: list[str] = []

    def job_ids(self) -> set[str]:
        return {j.id for j in self.jobs}

    def jobs_count(self) -> int:
        return len(self.jobs)


def parse_jobs(text: str) -> list[JobEntry]:
    """Parse `squeue -h -t all -o %i|%j|%T|%V`."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 4 and parts[0]:
            out.append(JobEntry(id=parts[0], name=parts[1], state=parts[2], submitted=parts[3]))
    return out


def judge_state_backup(
    loaded: list[JobEntry] | None,
    load_error: str | None,
    live_before: list[str],
    live_after: list[str],
    previous_jobs: int | None,
) -> list[str]:
    """Why a copy of the state directory is not a backup (empty: it is)."""
    if loaded is None:
        return [f"the copy did not load in a scratch slurmctld: {load_error or 'unknown error'}"]
    problems = []
    have = {j.id for j in loaded}
    missing = sorted((set(live_before) & set(live_after)) - have, key=_job_order)
    if missing:
        problems.append(f"jobs the live controller listed before and after the copy are not in it: "
                        f"{', '.join(missing)}")
    shrank = backup_checks.shrink_problem("jobs", len(loaded), previous_jobs)
    if shrank:
        problems.append(shrank)
    return problems


def _job_order(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, job_id)


def archive_name(taken_at: float) -> str:
    return f"{ARCHIVE_PREFIX}{int(taken_at * 1000):015d}{ARCHIVE_SUFFIX}"


def evidence_name(archive: str) -> str:
    return archive + EVIDENCE_SUFFIX


def newest_verified(evidence: list[StateBackupEvidence]) -> StateBackupEvidence | None:
    return backup_checks.newest_verified(evidence, "archive")


def to_prune(evidence: list[StateBackupEvidence], keep: int) -> list[StateBackupEvidence]:
    """All but the newest `keep` backups (oldest first), never the newest verified one."""
    ordered = sorted(evidence, key=lambda e: (e.taken_at, e.archive))
    newest = newest_verified(ordered)
    old = ordered[: max(len(ordered) - keep, 0)]
    return [e for e in old if newest is None or e.archive != newest.archive]


def conf_value(conf: str, key: str) -> str | None:
    """A key's value in slurm.conf text (keys are case-insensitive, slurm.conf(5))."""
    m = re.search(rf"(?im)^\s*{key}\s*=\s*(\S+)", conf)
    return m.group(1) if m else None


def scratch_conf(live: str, values: dict[str, str]) -> str:
    """The live slurm.conf with SCRATCH_KEYS replaced: the scratch controller listens on its own
    port, reads the backup as its StateSaveLocation, and is given a SlurmdPort no slurmd listens on,
    so it can reach no node and kill no job of the live cluster."""
    missing = [k for k in SCRATCH_KEYS if k not in values]
    if missing:
        raise ValueError(f"scratch_conf needs {', '.join(missing)}")
    out = []
    seen = set()
    for line in live.splitlines():
        key = line.split("=", 1)[0].strip()
        match = next((k for k in SCRATCH_KEYS if k.lower() == key.lower()), None)
        if match is not None and "=" in line:
            out.append(f"{match}={values[match]}")
            seen.add(match)
        else:
            out.append(line)
    out += [f"{k}={values[k]}" for k in SCRATCH_KEYS if k not in seen]
    return "\n".join(out) + "\n"


def state_loss_refusal(newest: StateBackupEvidence | None, now: float, max_age_s: float,
                       pending: int) -> str | None:
    """The blast-radius guard of slurm-state-loss: the controller's state may be destroyed only when
    a verified backup young enough to restore from exists, and only once at a time."""
    if pending:
        return "a slurm-state-loss fault is still pending in the ledger: revert it first"
    if newest is None:
        return "no verified backup of slurmctld's state to restore from: refusing to lose the state"
    age = now - newest.taken_at
    if age > max_age_s:
        return (f"the newest verified backup of slurmctld's state is {age:.0f} s old "
                f"(limit {max_age_s:g} s): is the backup job running?")
    return None


def jobs_back(expected: list[str], after: list[JobEntry]) -> tuple[list[str], list[str]]:
    """(came back, missing) of `expected` job ids in the controller's listing after a restore."""
    have = {j.id for j in after}
    back = [j for j in expected if j in have]
    return back, [j for j in expected if j not in have]
