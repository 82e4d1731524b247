"""A Slurm node's performance job (gpufleet.fleet.inspect.perf_job, ADR 0086): srun's arguments,
the step's verdict, a step that overruns cancelled, and the stack key's validation."""

from __future__ import annotations

import sys
import time

import pytest
from pydantic import ValidationError

import gpufleet.fleet.inspect.perf_job as PJ
from gpufleet.config.model import InspectSpec, PerfJob
from gpufleet.fleet.inspect.perf_job import IMMEDIATE_S, job_figures, run_job, srun_args


def test_one_exclusive_step_on_the_node_that_does_not_wait_for_a_job() -> None:
    argv = srun_args("gpu-7", 61, ["--gres=gpu:8"])
    assert argv[0] == "srun" and argv[-1] == "--gres=gpu:8"  # the site's, before the command
    assert {"--nodes=1", "--ntasks=1", "--nodelist=gpu-7", "--exclusive", f"--immediate={IMMEDIATE_S}",
            "--time=2", "--kill-on-bad-exit=1"} <= set(argv)  # 61 s: 2 of Slurm's minutes


@pytest.mark.parametrize(("rc", "out", "err", "figures", "why"), [
    (0, 'nccl-tests says 455\n{"perf": {"nccl_allreduce_busbw_gbs": 455.5}}\n', "",
     {"nccl_allreduce_busbw_gbs": 455.5}, None),
    (1, "", "srun: error: Unable to allocate resources: Requested nodes are busy", {},
     "srun exit 1: srun: error: Unable to allocate resources: Requested nodes are busy"),
    (0, "# Avg bus bandwidth : 455.5\n", "", {}, 'srun exit 0 but no line {"perf": {...}} in its output'),
    (0, '{"perf": {"busbw": 1}}', "", {}, "srun exit 0 but perf.busbw: not a metric inspect knows"),
])
def test_the_steps_verdict(rc: int, out: str, err: str, figures: dict[str, float], why: str | None) -> None:
    got, said = job_figures(rc, out, err)
    assert got == figures
    assert said == why if why is None else (said is not None and said.startswith(why))


def test_a_step_is_run_and_one_that_overruns_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for srun (this test needs no Slurm): python as the "prefix", the step's argv after.
    printer = [sys.executable, "-c", 'import sys; print(\'{"perf": {"h2d_gbs": 53.1}}\')']
    figures, why = run_job(printer, "gpu-1", [], 5)
    assert (figures, why) == ({"h2d_gbs": 53.1}, None)
    # Ignores the rest of its argv; sleeps past the wait, which SIGINT ends.
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(PJ, "IMMEDIATE_S", 0)
    monkeypatch.setattr(PJ, "MARGIN_S", 0.5)
    t0 = time.monotonic()
    figures, why = run_job(sleeper, "gpu-1", [], 0.5)
    assert figures == {} and why is not None and "did not end within 1 s; its job was cancelled" in why
    assert time.monotonic() - t0 < 10


def test_the_stack_key_is_validated() -> None:
    spec = InspectSpec.model_validate({"perfJob": {"command": ["nccl-wrap"], "srunArgs": ["--gres=gpu:8"]}})
    assert spec.perf_job == PerfJob(command=["nccl-wrap"], deadline_seconds=600.0, srun_args=["--gres=gpu:8"])
    for bad in ({"command": []}, {"command": ["x"], "deadlineSeconds": 0},
                {"command": ["x"], "srunArgs": ["-w gpu-1"]}):
        with pytest.raises(ValidationError):
            InspectSpec.model_validate({"perfJob": bad})
