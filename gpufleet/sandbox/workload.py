"""Submitting the training workload (gpufleet.sandbox.training) to the sandbox's Slurm and reading
its progress from the events file it appends to."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.sandbox.layout import Layout
from gpufleet.sandbox.slurm import slurm_argv


def job_name(layout: Layout) -> str:
    return f"train-{layout.run_id}"


def requeue_delay_seconds(health_check_interval: float, cred_expire: float) -> float:
    """How long the job script waits after a failed step before `scontrol requeue`.

    The wait exists so that the node health check drains the faulty node before the job is placed
    again. A requeued job cannot start before `cred_expire` anyway (sandbox-notes.md pitfall 4), so
    only the part of a health-check period that `cred_expire` does not cover (plus 1 s for the check
    itself) needs waiting: 0 with the sandbox's 5 s checks and 10 s cred_expire. A fixed 6 s wait
    used to add 6 s to every GPU-fault recovery."""
    return max(0.0, float(health_check_interval) + 1.0 - float(cred_expire))


def job_script(layout: Layout, python: str = sys.executable) -> str:
    """The job script rendered by the training package (the node helper's interface)."""
    from gpufleet.sandbox.training.jobscript import JobParams, render_job_script

    t = layout.sandbox.training
    params = JobParams(
        python=python,
        base_dir=str(layout.base_dir),
        checkpoint_dir=str(layout.checkpoint_dir),
        events_file=str(layout.events_file),
        file_sd_dir=str(layout.file_sd_dir),
        hosts_file=str(layout.hosts_file),
        nodes=t.nodes,
        ranks_per_node=t.ranks_per_node,
        checkpoint_every_steps=t.checkpoint_every_steps,
        step_sleep_seconds=t.step_sleep_seconds,
        max_steps=t.max_steps,
        pg_timeout=t.process_group_timeout_seconds,
        requeue_delay_seconds=requeue_delay_seconds(
            layout.sandbox.slurm.health_check_interval, layout.sandbox.slurm.cred_expire
        ),
    )
    return str(render_job_script(params))


def sbatch_argv(layout: Layout, script: Path) -> list[str]:
    t = layout.sandbox.training
    gpus = layout.compute_nodes[0].gpus
    return [
        "sbatch",
        "--parsable",
        # Requeue after a node failure (JobRequeue=1 makes it the default; explicit for clarity).
        "--requeue",
        f"--job-name={job_name(layout)}",
        f"--partition={layout.queue}",
        f"--nodes={t.nodes}",
        f"--ntasks-per-node={t.ranks_per_node}",
        f"--gres=gpu:{gpus}",
        f"--output={layout.path('training', 'slurm-%j.out')}",
        f"--chdir={layout.path('training')}",
        str(script),
    ]


def submit(layout: Layout, python: str = sys.executable) -> str:
    d = layout.path("training")
    d.mkdir(parents=True, exist_ok=True)
    layout.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    script = d / "job.sh"
    script.write_text(job_script(layout, python))
    script.chmod(0o755)
    res = subprocess.run(
        slurm_argv(layout.head.netns, layout.slurm_conf, *sbatch_argv(layout, script)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        raise RuntimeError(f"sbatch failed: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


@dataclass(frozen=True)
class Progress:
    max_step: int
    steps_seen: int
    restarts: int
    first_t: float | None
    last_t: float | None


def parse_events(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line being appended right now
        if isinstance(ev, dict):
            out.append(ev)
    return out


def progress(events: list[dict[str, Any]]) -> Progress:
    steps = [(float(e.get("t", 0)), int(e["step"])) for e in events if isinstance(e.get("step"), int)]
    restarts = max((int(e.get("restart", 0)) for e in events if isinstance(e.get("restart"), int)), default=0)
    return Progress(
        max_step=max((s for _, s in steps), default=-1),
        steps_seen=len({s for _, s in steps}),
        restarts=restarts,
        first_t=min((t for t, _ in steps), default=None),
        last_t=max((t for t, _ in steps), default=None),
    )


def read_progress(path: Path) -> Progress:
    try:
        text = path.read_text()
    except OSError:
        return progress([])
    return progress(parse_events(text.splitlines()))


def progressing(p: Progress) -> bool:
    """At least two distinct steps reported: the job is running, not just started."""
    return p.steps_seen >= 2 and p.max_step >= 1
