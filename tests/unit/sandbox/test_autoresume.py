"""The auto-resume controller: its pure policy, and one controller against stand-in sbatch/scontrol."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.sandbox_contract import ControllerStatus, Restart, read_controller_status
from gpufleet.core.training_events import EventName, TrainingEvent
from gpufleet.sandbox.training.autoresume import (
    Controller,
    ControllerConfig,
    backoff,
    decide,
    fast_failures,
    job_over,
    parse_job_state,
)


def cfg(tmp_path: Path, **kw: object) -> ControllerConfig:
    base: dict[str, object] = dict(sbatch=["/bin/false"], script="/x/job.sh", slurm_conf="/x/slurm.conf",
                                   status_file=str(tmp_path / "status.json"),
                                   events_file=str(tmp_path / "events.jsonl"), delay_s=6.0,
                                   backoff_max_s=60.0, max_restarts=3, window_s=600.0)
    base.update(kw)
    return ControllerConfig.model_validate(base)


def test_job_over() -> None:
    assert not job_over("RUNNING") and not job_over("PENDING")
    # --no-requeue: a COMPLETING job never runs again, and a purged job (None) is over too.
    assert job_over("COMPLETING") and job_over("FAILED") and job_over("NODE_FAIL") and job_over(None)


def test_parse_job_state() -> None:
    line = "JobId=7 JobName=train-ab UserId=root(0) JobState=NODE_FAIL Reason=NodeDown Dependency=(null)"
    assert parse_job_state(line) == "NODE_FAIL"
    assert parse_job_state("JobId=7") is None


def test_backoff_doubles_for_each_incarnation_that_made_no_step() -> None:
    # The sandbox: no wait after a run that made progress (the Epilog drained a broken node).
    assert backoff(0.0, 5.0, 0, 60.0) == 0.0
    assert backoff(0.0, 5.0, 1, 60.0) == 5.0
    assert backoff(0.0, 5.0, 2, 60.0) == 10.0
    assert backoff(0.0, 5.0, 5, 60.0) == 60.0
    # A site with a fixed delay never backs off below it.
    assert backoff(6.0, 5.0, 0, 60.0) == 6.0
    assert backoff(6.0, 5.0, 1, 60.0) == 6.0
    assert backoff(6.0, 5.0, 3, 60.0) == 24.0


def test_the_sandbox_controller_resubmits_without_a_fixed_wait(tmp_path: Path) -> None:
    c = ControllerConfig.model_validate(dict(sbatch=["/bin/false"], script="/x/job.sh",
                                             slurm_conf="/x/slurm.conf", status_file=str(tmp_path / "s"),
                                             events_file=str(tmp_path / "e")))
    st = ControllerStatus(pid=1, incarnation=0, job_id="1", ended_at=100.0)
    assert decide(st, "FAILED", 100.0, c, 0).kind == "submit"
    assert decide(st, "FAILED", 104.9, c, 1).kind == "wait"  # a job that cannot start does not spin
    assert decide(st, "FAILED", 105.0, c, 1).kind == "submit"


def test_fast_failures_counts_back_to_the_last_incarnation_that_stepped() -> None:
    def ev(event: EventName, restart: int) -> TrainingEvent:
        return TrainingEvent(t=1.0, event=event, step=1, restart=restart, job_id=1, node="n", rank=0)

    events = [ev("step", 0), ev("start", 1), ev("start", 2)]
    assert fast_failures(events, 2) == 2
    assert fast_failures([*events, ev("step", 2)], 2) == 0


def test_decide(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    st = ControllerStatus(pid=1)
    assert decide(st, None, 100.0, c, 0).kind == "submit"  # nothing submitted yet
    st = ControllerStatus(pid=1, incarnation=0, job_id="1", ended_at=None)
    assert decide(st, "RUNNING", 100.0, c, 0).kind == "wait"
    st.ended_at = 100.0
    assert decide(st, "FAILED", 103.0, c, 0).kind == "wait"  # within a configured delay (6 s)
    assert decide(st, "FAILED", 106.0, c, 0).kind == "submit"
    assert decide(st, "FAILED", 111.0, c, 2).kind == "wait"  # backoff: 12 s after two stepless runs
    assert decide(st, "FAILED", 112.0, c, 2).kind == "submit"
    assert decide(st, "NODE_FAIL", 100.0, c, 0).kind == "submit"  # the node is already down
    assert decide(st, "COMPLETED", 100.0, c, 0).kind == "finished"
    # The budget: 3 restarts within the window, then give up; a reset (budget_since) allows more.
    st.restarts = [Restart(t=t, incarnation=i, job_id=str(i), previous_job_id=None, previous_state="FAILED")
                   for i, t in enumerate((10.0, 20.0, 30.0), 1)]
    gave = decide(st, "FAILED", 200.0, c, 0)
    assert gave.kind == "give-up" and "3 restarts within 600 s" in gave.why
    st.budget_since = 150.0
    assert decide(st, "FAILED", 200.0, c, 0).kind == "submit"
    # Restarts older than the window do not count.
    assert decide(st.model_copy(update={"budget_since": 0.0}), "FAILED", 700.0, c, 0).kind == "submit"


Slurm = tuple[Path, Path, Path]


@pytest.fixture()
def fake_slurm(tmp_path: Path) -> Slurm:
    """sbatch prints the next job id; scontrol reports the state written to <id>.state."""
    d = tmp_path / "slurm"
    d.mkdir()
    sbatch = d / "sbatch"
    sbatch.write_text(f"""#!/bin/bash
n=$(cat {d}/next 2>/dev/null || echo 1); echo $((n+1)) > {d}/next
echo "$@" >> {d}/sbatch.log; echo RUNNING > {d}/$n.state; echo "$n;cluster"
""")
    scontrol = d / "scontrol"
    scontrol.write_text(f"""#!/bin/bash
f={d}/$4.state; [ -f $f ] || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }}
echo "JobId=$4 JobState=$(cat $f) Reason=None"
""")
    for f in (sbatch, scontrol):
        f.chmod(0o755)
    return d, sbatch, scontrol


def test_controller_submits_a_new_job_per_incarnation(tmp_path: Path, fake_slurm: Slurm) -> None:
    d, sbatch, scontrol = fake_slurm
    c = cfg(tmp_path, sbatch=[str(sbatch), "--no-requeue"], scontrol=str(scontrol), delay_s=5.0)
    ctl = Controller(c)
    assert ctl.step(0.0).kind == "submit"
    assert (ctl.status.incarnation, ctl.status.job_id) == (0, "1")
    (d / "1.state").write_text("NODE_FAIL\n")
    assert ctl.step(1.0).kind == "submit"  # no wait after NODE_FAIL
    assert (ctl.status.incarnation, ctl.status.job_id) == (1, "2")
    (d / "2.state").unlink()  # purged: Slurm no longer knows it
    assert ctl.step(2.0).kind == "wait"
    (tmp_path / "events.jsonl").write_text(
        TrainingEvent(t=1.0, event="step", step=1, restart=1, job_id=2, node="gpu-0", rank=0).line()
    )
    assert ctl.step(7.5).kind == "submit"
    assert [r.previous_state for r in ctl.status.restarts] == ["NODE_FAIL", "PURGED"]
    log = (d / "sbatch.log").read_text().splitlines()
    assert log == [f"--no-requeue --export=ALL,GPUFLEET_INCARNATION={i} /x/job.sh" for i in range(3)]


def test_controller_adopts_its_job_after_a_restart(tmp_path: Path, fake_slurm: Slurm) -> None:
    d, sbatch, scontrol = fake_slurm
    c = cfg(tmp_path, sbatch=[str(sbatch)], scontrol=str(scontrol))
    from gpufleet.core.sandbox_contract import write_controller_status

    write_controller_status(Path(c.status_file), ControllerStatus(pid=1, incarnation=4, job_id="9"))
    (d / "9.state").write_text("RUNNING\n")
    ctl = Controller(c)
    assert ctl.step(0.0).kind == "wait" and ctl.status.incarnation == 4
    assert not (d / "sbatch.log").exists()
    assert read_controller_status(Path(c.status_file)).job_id == "9"
