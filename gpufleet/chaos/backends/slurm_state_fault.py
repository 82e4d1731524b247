"""`slurm-state-loss` on the sandbox: its plan (slurmctld SIGKILLed, its StateSaveLocation moved
aside to `<dir>.lost-<ms>`, the jobs it listed just before recorded), guarded by
core.slurm_backup_checks.state_loss_refusal (no verified backup young enough: refused).

The rollback: the controller's state directory restored from
the newest verified backup (core.slurm_state_backups; the one moved aside by the fault only when no
verified backup is left), slurmctld started again from its recorded recipe, and the jobs it answers
with recorded (`<run>/slurm/state-loss.jsonl`, read by the drill's verdict).

Its arguments are all in the ledger, so `gpufleet chaos revert` can run it after the runner died.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from gpufleet.chaos import sysops
from gpufleet.chaos.backends.base import Plan
from gpufleet.chaos.backends.sandbox_undo import _update_state_pid, netns_exists
from gpufleet.chaos.ledger import Rollback
from gpufleet.core.jsonl import append_objects
from gpufleet.core.procs import alive, launch
from gpufleet.core.sandbox_contract import Launch, SandboxState
from gpufleet.core.slurm_backup_checks import StateBackupEvidence, newest_verified, state_loss_refusal
from gpufleet.core.slurm_state_backups import (
    SlurmBackupError,
    backup_dir,
    controller,
    list_evidence,
    live_jobs,
    restore_newest,
    squeue_all,
    state_save_location,
)
from gpufleet.core.slurm_state_offsite import S3_ERRORS, fetch_newest, list_offsite, offsite_for

logger = logging.getLogger("chaostoolkit")
ANSWER_TIMEOUT_S = 60.0
# The newest verified backup may be at most this old for the fault to be allowed: a few rounds of
# the backup job at the shipped stacks' intervals (5-60 s); older means the job is not running.
MAX_BACKUP_AGE_S = 180.0
RECORD = "state-loss.jsonl"  # under <run>/slurm/: what the fault saw and what the restore brought back


def record(run_slurm_dir: str | Path, **doc: Any) -> None:
    append_objects(Path(run_slurm_dir) / RECORD, [{"t": time.time(), **doc}])


def plan(
    state: SandboxState, stack: str, state_root: Path | None, scope: str = "state-dir"
) -> Plan:
    ctl = controller(state)
    if ctl is None or state.head_netns is None or state.slurm_conf is None:
        raise ActivityFailed("this sandbox records no slurmctld: nothing to lose")
    try:
        state_dir = state_save_location(state)
    except (OSError, SlurmBackupError) as e:
        raise ActivityFailed(f"slurmctld's StateSaveLocation is unknown: {e}") from None
    folder = backup_dir(state)
    host = scope == "controller-host"
    if host:
        # The host's backups go with it: what a restore can use is the newest off-host copy.
        offsite = offsite_for(stack, state_root)
        if offsite is None:
            raise ActivityFailed("slurm-state-loss refused: scope controller-host needs the stack's storage "
                                 "sandbox, whose backup bucket holds the off-host copies; it is not up")
        try:
            newest = newest_verified(list_offsite(*offsite))
        except S3_ERRORS as e:
            raise ActivityFailed(f"slurm-state-loss refused: the backup bucket did not answer: {e}") from None
    else:
        newest = newest_verified(list_evidence(folder))
    running = alive(ctl.pid, ctl.start_time)
    refusal = state_loss_refusal(newest, time.time(), MAX_BACKUP_AGE_S, 0 if running else 1)
    if refusal:
        where = "off-host (the backup bucket)" if host else "on the host"
        raise ActivityFailed(f"slurm-state-loss refused: {refusal} ({where})")
    stamp = int(time.time() * 1000)
    aside = state_dir.with_name(f"{state_dir.name}.lost-{stamp}")
    backups_aside = folder.with_name(f"{folder.name}.lost-{stamp}") if host else None
    rb = Rollback("sandbox.slurm-state-restore", {
        "stack": stack, "state_root": str(state_root) if state_root else None, "netns": state.head_netns,
        "slurm_conf": state.slurm_conf, "state_dir": str(state_dir), "aside": str(aside),
        "backups": str(folder), "launch": ctl.launch.model_dump(), "scope": scope,
    })

    def apply() -> dict[str, Any]:
        jobs = live_jobs(state) or []
        if not sysops.signal_verified(ctl.pid, ctl.start_time, signal.SIGKILL):
            raise ActivityFailed("slurmctld is no longer the recorded process: nothing was done")
        deadline = time.monotonic() + 10
        while alive(ctl.pid, ctl.start_time) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.replace(state_dir, aside)
        if backups_aside is not None and folder.exists():
            os.replace(folder, backups_aside)  # kept for an operator, never restored from
        record(state_dir.parent, event="state_lost", aside=str(aside), jobs=[j.model_dump() for j in jobs],
               scope=scope, backups_aside=str(backups_aside) if backups_aside else None)
        return {"killed": ctl.pid, "moved_aside": str(aside), "jobs_before": [j.id for j in jobs],
                **({"backups_moved_aside": str(backups_aside)} if backups_aside else {})}

    lost = f"{state_dir} and the host's backups {folder}" if host else str(state_dir)
    return Plan("slurm-state-loss", {"controller": "slurmctld"},
                {"backup": newest.archive if newest else None, "scope": scope}, rb, apply,
                f"SIGKILL slurmctld and move {lost} aside (newest verified backup "
                f"{'off-host ' if host else ''}{newest.archive if newest else '-'})")


def _running(netns: str, program: list[str]) -> bool:
    return any(sysops.cmdline(pid) == program for pid in sysops.netns_pids(netns))


def _restore_newest(args: dict[str, Any], state_dir: Path) -> tuple[StateBackupEvidence, str]:
    """The newest verified backup on the host, else the newest verified off-host copy fetched from
    the backup bucket (the host's backups were lost with it, or none of them verifies)."""
    backups = Path(args["backups"])
    try:
        return restore_newest(backups, state_dir), "host"
    except SlurmBackupError as on_host:
        root = args.get("state_root")
        offsite = offsite_for(str(args.get("stack")), Path(root) if root else None)
        if offsite is None:
            raise
        try:
            fetched = fetch_newest(*offsite, backups)
        except S3_ERRORS as e:
            raise SlurmBackupError(f"{on_host}; the backup bucket did not answer: {e}") from None
        logger.info("no usable state backup on the host (%s): fetched %s from the backup bucket",
                    on_host, fetched.archive)
        return restore_newest(backups, state_dir), "backup bucket"


def rb_slurm_state_restore(args: dict[str, Any]) -> None:
    recipe = Launch.model_validate(args["launch"])
    netns = str(recipe.netns or args["netns"])
    if not netns_exists(netns):
        logger.warning("namespace %s is gone (sandbox down?): nothing to restore", netns)
        return
    state_dir, aside = Path(args["state_dir"]), Path(args["aside"])
    running = _running(netns, recipe.program)
    if running and state_dir.exists():
        return  # restored already (the drill's restore, then its rollback)
    source: dict[str, Any]
    if not state_dir.exists():
        try:
            chosen, where = _restore_newest(args, state_dir)
            source = {"backup": chosen.archive, "taken_at": chosen.taken_at,
                      "backup_jobs": sorted(chosen.job_ids()), "from": where}
        except SlurmBackupError as e:
            if not aside.exists():
                raise ActivityFailed(f"slurmctld's state cannot be restored: {e}; {aside} is gone") from None
            logger.warning("%s: putting the state moved aside back instead", e)
            os.replace(aside, state_dir)
            source = {"backup": None, "moved_back": str(aside)}
    else:
        source = {"backup": None, "state_dir_present": True}
    restarted_at = time.time()
    if not running:
        popen, st = launch(recipe)
        if st is None:
            raise ActivityFailed(f"slurmctld exited at once ({popen.wait(5)}); see {recipe.log}")
        _update_state_pid(args.get("stack"), args.get("state_root"), "slurmctld", popen.pid, st)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    jobs = None
    while jobs is None and time.monotonic() < deadline:
        jobs = squeue_all(netns, str(args["slurm_conf"]))
        if jobs is None:
            time.sleep(0.3)
    if jobs is None:
        raise ActivityFailed(f"slurmctld did not answer squeue {ANSWER_TIMEOUT_S:g} s after the restore")
    record(state_dir.parent, event="state_restored", restarted_at=restarted_at,
           jobs=[j.model_dump() for j in jobs], **source)
