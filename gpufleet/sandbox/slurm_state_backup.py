"""The Slurm sandbox's state backup job: every `--interval` seconds (the stack's
`dr.backupIntervalSeconds`) a copy of slurmctld's StateSaveLocation taken while the controller is
paused, archived with its sha256 into `<run>/slurm/state-backups/`, and proven restorable in a
scratch slurmctld before it counts (core.slurm_state_backups.take_backup). Each round is a line of
`<run>/slurm/state-backup.jsonl` ("slurm_state_backup" or "slurm_state_backup_failed", with the
evidence), the same evidence being kept beside the archive. When the stack's storage sandbox is up,
each verified backup is also copied to its backup bucket and read back (core.slurm_state_offsite);
the line's `offsite` says how that went.

The sandbox state file is read every round: a chaos rollback that restarts slurmctld records its
new process there.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.core.jsonl import append_objects
from gpufleet.core.sandbox_contract import SandboxState
from gpufleet.core.slurm_backup_checks import StateBackupEvidence, newest_verified
from gpufleet.core.slurm_state_backups import backup_dir, list_evidence, take_backup
from gpufleet.core.slurm_state_offsite import S3_ERRORS, offsite_for, prune_offsite, ship
from gpufleet.sandbox.layout import Layout
from gpufleet.sandbox.processes import Started, spawn

EVENTS = "state-backup.jsonl"  # under <run>/slurm/


def events_file(state: SandboxState) -> Path:
    return Path(state.base_dir) / "slurm" / EVENTS


def start(layout: Layout, state_file: Path, interval_s: float, python: str = sys.executable) -> Started:
    """The backup job, a process of the sandbox in the root namespace (it enters the head namespace
    for Slurm's commands and the scratch controller)."""
    argv = [python, "-m", "gpufleet.sandbox.slurm_state_backup", "--state-file", str(state_file),
            "--interval", f"{interval_s:g}"]
    return spawn("slurm-state-backup", argv, layout.path("logs", "slurm-state-backup.log"))


def backup_round(state_file: Path, previous: StateBackupEvidence | None) -> StateBackupEvidence | None:
    """One round; the evidence (None when no copy could be taken, said in the events file)."""
    state = SandboxState.model_validate_json(state_file.read_text())
    if previous is None:
        previous = newest_verified(list_evidence(backup_dir(state)))
    try:
        evidence = take_backup(state, previous)
    except Exception as e:  # the controller is down or paused by a fault: the next round tries again
        append_objects(events_file(state), [{"t": time.time(), "event": "slurm_state_backup_failed",
                                             "error": f"{type(e).__name__}: {e}"[:400]}])
        return None
    event = "slurm_state_backup" if evidence.verified else "slurm_state_backup_failed"
    line: dict[str, Any] = {"t": time.time(), "event": event, **evidence.model_dump(mode="json")}
    if evidence.verified:
        line["offsite"] = _ship(state, state_file.parent.parent, evidence)
    append_objects(events_file(state), [line])
    return evidence


def _ship(state: SandboxState, root: Path, evidence: StateBackupEvidence) -> dict[str, Any] | None:
    """The verified backup copied off the host when the stack's storage sandbox is up (None when it
    is not); a failed copy is said in the events, and the next round ships its own backup."""
    target = offsite_for(state.stack, root)
    if target is None:
        return None
    client, bucket = target
    try:
        shipped = ship(client, bucket, backup_dir(state), evidence)
        prune_offsite(client, bucket)
    except S3_ERRORS as e:
        return {"bucket": bucket, "verified": False, "problem": f"{type(e).__name__}: {e}"[:400]}
    return shipped


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="gpufleet-slurm-state-backup", description=__doc__)
    p.add_argument("--state-file", required=True)
    p.add_argument("--interval", type=float, required=True)
    args = p.parse_args(argv)
    stop = False

    def _term(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    previous: StateBackupEvidence | None = None
    while not stop:
        t0 = time.monotonic()
        evidence = backup_round(Path(args.state_file), previous)
        if evidence is not None and evidence.verified:
            previous = evidence
        time.sleep(max(args.interval - (time.monotonic() - t0), 0.1))


if __name__ == "__main__":
    main()
