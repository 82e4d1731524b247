"""`python -m gpufleet.sandbox.training.autoresume`: the platform's auto-resume controller.

A training job that fails is not requeued by Slurm (its JobId would be kept, and the clean-up of the
old incarnation on a node that comes back would then cancel the new one: sandbox-notes.md item 11).
Instead this controller, a daemon in the head namespace, watches the job and, when it has ended for
any reason but success, submits a NEW job (a new JobId) that resumes from the latest checkpoint, as
training platforms' auto-resume does (NVIDIA NeMo / Megatron "autoresume" and torchrun's restart
budget follow the same idea): a returning node can then only clean up a job that is already over.

Policy (pure, `decide`): after a failed job, wait `delay_s` (0 in the sandbox: its Slurm runs the node
health check as the Epilog, so a node the fault broke is drained before the job leaves COMPLETING,
and Slurm places no job on a node still completing one; ADR 0051); after an incarnation that failed
before it made a step, `backoff_s`, doubled for each more such incarnation in a row (capped at
`backoff_max_s`), so a job that cannot start does not spin; at most `max_restarts` restarts
within `window_s` (a restart budget, like torchrun's --max-restarts), then give up and say so in the
status file. SIGHUP resets the budget (the game-day's healing uses it). The status file is JSON
(`ControllerStatus`), rewritten atomically on every change; the events file is untouched.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.sandbox_contract import (
    ControllerStatus,
    Restart,
    read_controller_status,
    write_controller_status,
)
from gpufleet.core.training_events import TrainingEvent, read_events

# Slurm job states (squeue(1), "JOB STATE CODES") in which the job may still run or is running.
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD",
})
# A job submitted with --no-requeue that is COMPLETING never runs again: it is over.
SUCCESS = "COMPLETED"


class ControllerConfig(BaseModel):
    """What the sandbox gives the controller (written by gpufleet.sandbox.workload)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sbatch: list[str]  # sbatch argv up to (not including) the script; --export is added per incarnation
    script: str
    scontrol: str = "/usr/bin/scontrol"
    slurm_conf: str
    status_file: str
    events_file: str  # to tell a failure before the first step (backoff) from one after progress
    delay_s: float = Field(ge=0, default=0.0)  # after a failed job that made progress
    backoff_s: float = Field(gt=0, default=5.0)  # after the first incarnation in a row that made no step
    backoff_max_s: float = Field(ge=0, default=60.0)
    max_restarts: int = Field(ge=0, default=20)
    window_s: float = Field(gt=0, default=3600.0)
    poll_s: float = Field(gt=0, default=0.5)


@dataclass(frozen=True)
class Decision:
    kind: str  # "wait" | "submit" | "give-up" | "finished"
    why: str = ""


def job_over(state: str | None) -> bool:
    """None = Slurm no longer knows the job (purged after MinJobAge): over."""
    return state is None or state not in ACTIVE_STATES


def backoff(delay_s: float, backoff_s: float, fast_failures: int, cap_s: float) -> float:
    """`delay_s` after a run that made progress; after k >= 1 incarnations in a row that failed
    before their first step, max(delay, backoff) * 2^(k-1), capped."""
    if fast_failures <= 0:
        return delay_s
    return min(cap_s, max(delay_s, backoff_s) * 2.0 ** (fast_failures - 1))


def decide(
    status: ControllerStatus, state: str | None, now: float, cfg: ControllerConfig, fast_failures: int
) -> Decision:
    """What to do about the current job, given its Slurm state (pure)."""
    if status.finished:
        return Decision("finished")
    if status.gave_up:
        return Decision("wait", status.gave_up)
    if status.job_id is None:
        return Decision("submit", "no job yet")
    if not job_over(state):
        return Decision("wait", f"job {status.job_id} is {state}")
    if state == SUCCESS:
        return Decision("finished", f"job {status.job_id} completed")
    ended = status.ended_at if status.ended_at is not None else now
    recent = [r for r in status.restarts if r.t >= max(now - cfg.window_s, status.budget_since)]
    if len(recent) >= cfg.max_restarts:
        return Decision(
            "give-up",
            f"restart budget spent: {len(recent)} restarts within {cfg.window_s:g} s "
            f"(max {cfg.max_restarts}); job {status.job_id} ended {state or 'and was purged'}",
        )
    # NODE_FAIL: Slurm has already marked the failed node down, so there is no drain to wait for.
    wait = (0.0 if state == "NODE_FAIL"
            else backoff(cfg.delay_s, cfg.backoff_s, fast_failures, cfg.backoff_max_s))
    if now - ended < wait:
        left = wait - (now - ended)
        return Decision("wait", f"job {status.job_id} ended {state}; resubmitting in {left:.1f} s")
    return Decision("submit", f"job {status.job_id} ended {state or '(purged)'}")


def fast_failures(events: list[TrainingEvent], current: int) -> int:
    """How many incarnations in a row, ending with `current`, made no step (pure)."""
    stepped = {e.restart for e in events if e.event == "step"}
    n = 0
    for inc in range(current, -1, -1):
        if inc in stepped:
            break
        n += 1
    return n


# --------------------------------------------------------------------------- I/O


def parse_job_state(text: str) -> str | None:
    """JobState from `scontrol -o show job <id>` (None when absent)."""
    for tok in text.split():
        if tok.startswith("JobState="):
            return tok.split("=", 1)[1]
    return None


class Controller:
    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        self.env = {**os.environ, "SLURM_CONF": cfg.slurm_conf}
        path = Path(cfg.status_file)
        try:
            self.status = read_controller_status(path)  # restarted controller: adopt the job it ran
            self.status.pid = os.getpid()
        except (OSError, ValueError):
            self.status = ControllerStatus(pid=os.getpid())
        self.reset_requested = False

    def job_state(self) -> str | None:
        res = subprocess.run(
            [self.cfg.scontrol, "-o", "show", "job", str(self.status.job_id)],
            capture_output=True, text=True, timeout=15, env=self.env, check=False,
        )
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return None
            raise RuntimeError(f"scontrol failed: {res.stderr.strip()}")
        return parse_job_state(res.stdout)

    def submit(self, incarnation: int) -> str:
        argv = [*self.cfg.sbatch, f"--export=ALL,GPUFLEET_INCARNATION={incarnation}", self.cfg.script]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=self.env, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"sbatch failed: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def events(self) -> list[TrainingEvent]:
        return read_events(self.cfg.events_file)

    def step(self, now: float) -> Decision:
        s = self.status
        if self.reset_requested:
            self.reset_requested = False
            s.gave_up, s.budget_since = None, now
            log(f"SIGHUP: restart budget reset at {now:.3f}")
        state = self.job_state() if s.job_id is not None else None
        if state != s.job_state:
            log(f"job {s.job_id}: {s.job_state} -> {state}")
        s.job_state = state
        if s.job_id is not None and job_over(state) and s.ended_at is None:
            s.ended_at = now
        fast = fast_failures(self.events(), s.incarnation) if s.ended_at else 0
        d = decide(s, state, now, self.cfg, fast)
        if d.kind == "submit":
            previous, prev_state = s.job_id, state or "PURGED"
            incarnation = s.incarnation + 1
            job_id = self.submit(incarnation)
            if previous is not None:
                s.restarts.append(Restart(t=now, incarnation=incarnation, job_id=job_id,
                                          previous_job_id=previous, previous_state=prev_state))
            s.incarnation, s.job_id, s.job_state, s.ended_at = incarnation, job_id, "PENDING", None
            log(f"submitted incarnation {incarnation} as job {job_id} ({d.why})")
        elif d.kind == "give-up" and s.gave_up is None:
            s.gave_up = d.why
            log(f"giving up: {d.why}")
        elif d.kind == "finished" and not s.finished:
            s.finished = True
            log(f"training finished: {d.why}")
        return d


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} autoresume: {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.training.autoresume", description=__doc__)
    p.add_argument("--config", type=Path, required=True)
    args = p.parse_args(argv)
    cfg = ControllerConfig.model_validate_json(args.config.read_text())
    ctl = Controller(cfg)
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    def on_hup(signum: int, frame: FrameType | None) -> None:
        ctl.reset_requested = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    path = Path(cfg.status_file)
    while not stop:
        before = ctl.status.model_dump_json(exclude={"updated_at"})
        try:
            ctl.step(time.time())
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"error (retrying): {e}")  # slurmctld restarting, a slow scontrol: try again
        if ctl.status.model_dump_json(exclude={"updated_at"}) != before or ctl.status.updated_at == 0:
            write_controller_status(path, ctl.status)
        time.sleep(cfg.poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
