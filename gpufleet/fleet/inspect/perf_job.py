"""A Slurm node's performance job (`inspect.perfJob`, ADR 0086): the stack's command run as one job
step on the node through `srun`, its figures read from the JSON line it prints (the performance
pod's contract, gpufleet.fleet.node_pod.perf_figures).

- `--exclusive`: the step has the node to itself, as a collective bandwidth test must;
- `--immediate`: a node that a job took since the plan was made is not waited for, and the step
  fails saying so (inspect's plan: jobs take precedence); a drained node is not asked at all, since
  Slurm starts no job there (gpufleet inspect says so);
- `--time`: the stack's deadline, rounded up to Slurm's minutes; the wait for srun is that deadline
  plus the immediate allocation's seconds and a margin, after which srun gets SIGINT twice within a
  second, which terminates the job (srun(1), "SIGNALS AND ESCAPE SEQUENCES");
- the site's `srunArgs` (its GPUs as gres, its partition) go before the command.

`srun_args` and `job_figures` are pure; `run_job` is the thin I/O.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from collections.abc import Sequence

from gpufleet.fleet.node_pod import perf_figures

IMMEDIATE_S = 10
MARGIN_S = 30.0
STOP_S = 10.0
JOB_NAME = "gpufleet-perf"


def srun_args(node: str, deadline_s: float, extra: Sequence[str] = ()) -> list[str]:
    """srun's argv for one step on `node` (pure; module docstring)."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--exclusive",
            f"--immediate={IMMEDIATE_S}", f"--time={max(1, math.ceil(deadline_s / 60))}",
            f"--job-name={JOB_NAME}", "--kill-on-bad-exit=1", *extra]


def job_figures(returncode: int, stdout: str, stderr: str) -> tuple[dict[str, float], str | None]:
    """The step's figures, or ({}, why not) (pure)."""
    if returncode != 0:
        said = " ".join(stderr.split()[-40:]) or " ".join(stdout.split()[-40:])
        return {}, f"srun exit {returncode}" + (f": {said}" if said else "")
    figures, why = perf_figures(stdout)
    if why is None:
        return figures, None
    return figures, f"srun exit 0 but {why.replace('termination message', 'output')}"


def run_job(prefix: Sequence[str], node: str, command: Sequence[str], deadline_s: float,
            extra: Sequence[str] = ()) -> tuple[dict[str, float], str | None]:
    """Run the step (`prefix`: how Slurm commands are run here, e.g. the sandbox's head namespace)."""
    argv = [*prefix, *srun_args(node, deadline_s, extra), *command]
    wait_s = deadline_s + IMMEDIATE_S + MARGIN_S
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return {}, f"srun: {e}"
    try:
        out, err = proc.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        for _ in range(2):  # `ip netns exec` and `env` exec srun: this PID is srun's
            proc.send_signal(signal.SIGINT)
            time.sleep(0.2)
        try:
            proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return {}, f"srun did not end within {wait_s:g} s; its job was cancelled"
    return job_figures(proc.returncode, out, err)
