"""The training workload (gpufleet.sandbox.training): its job script, the auto-resume controller that
submits it to the sandbox's Slurm, and its progress read from the events file it appends to."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.training_events import TrainingEvent, read_events
from gpufleet.sandbox.layout import Layout
from gpufleet.sandbox.processes import Started, spawn


def job_name(layout: Layout) -> str:
    return f"train-{layout.run_id}"


def job_script(layout: Layout, python: str = sys.executable) -> str:
    """The job script rendered by the training package (the node helper's interface)."""
    from gpufleet.sandbox.training.jobscript import JobParams, render_job_script

    t = layout.sandbox.training
    params = JobParams(
        python=python,
        base_dir=str(layout.base_dir),
        checkpoint_dir=str(layout.checkpoint_dir),
        checkpoint_s3=None if layout.checkpoint_s3 is None else str(layout.checkpoint_s3),
        events_file=str(layout.events_file),
        file_sd_dir=str(layout.file_sd_dir),
        hosts_file=str(layout.hosts_file),
        nodes=t.nodes,
        ranks_per_node=t.ranks_per_node,
        checkpoint_every_steps=t.checkpoint_every_steps,
        step_sleep_seconds=t.step_sleep_seconds,
        max_steps=t.max_steps,
        pg_timeout=t.process_group_timeout_seconds,
    )
    return str(render_job_script(params))


def sbatch_argv(layout: Layout) -> list[str]:
    """sbatch up to the script; the controller adds --export with the incarnation and the script."""
    t = layout.sandbox.training
    gpus = layout.compute_nodes[0].gpus
    return [
        "/usr/bin/sbatch",
        "--parsable",
        # A failed job ends; the auto-resume controller submits a new one (never a requeue that
        # keeps the JobId: autoresume.py says why).
        "--no-requeue",
        f"--job-name={job_name(layout)}",
        f"--partition={layout.queue}",
        f"--nodes={t.nodes}",
        f"--ntasks-per-node={t.ranks_per_node}",
        f"--gres=gpu:{gpus}",
        f"--output={layout.path('training', 'slurm-%j.out')}",
        f"--chdir={layout.path('training')}",
    ]


def controller_status_file(layout: Layout) -> Path:
    return layout.path("training", "autoresume.json")


def write_controller_config(layout: Layout, python: str = sys.executable) -> Path:
    """Write the job script and the auto-resume controller's configuration; returns the latter."""
    from gpufleet.sandbox.training.autoresume import ControllerConfig

    d = layout.path("training")
    d.mkdir(parents=True, exist_ok=True)
    layout.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    script = d / "job.sh"
    script.write_text(job_script(layout, python))
    script.chmod(0o755)
    cfg = ControllerConfig(
        sbatch=sbatch_argv(layout),
        script=str(script),
        slurm_conf=str(layout.slurm_conf),
        status_file=str(controller_status_file(layout)),
        events_file=str(layout.events_file),
        # No fixed wait after a failed job: Slurm's Epilog runs the node health check, so a node the
        # fault broke is drained before the job is over (ADR 0051).
        delay_s=0.0,
    )
    path = d / "autoresume-config.json"
    path.write_text(cfg.model_dump_json(indent=2))
    return path


def start_controller(layout: Layout, python: str = sys.executable) -> Started:
    """The auto-resume controller, a daemon in the head namespace that submits the job."""
    config = write_controller_config(layout, python)
    return spawn(
        "autoresume",
        [python, "-m", "gpufleet.sandbox.training.autoresume", "--config", str(config)],
        layout.path("logs", "autoresume.log"),
        netns=layout.head.netns,
    )


@dataclass(frozen=True)
class Progress:
    max_step: int
    steps_seen: int
    restarts: int
    first_t: float | None
    last_t: float | None


def progress(events: list[TrainingEvent]) -> Progress:
    steps = [(e.t, e.step) for e in events if e.step is not None]
    restarts = max((e.restart for e in events), default=0)
    return Progress(
        max_step=max((s for _, s in steps), default=-1),
        steps_seen=len({s for _, s in steps}),
        restarts=restarts,
        first_t=min((t for t, _ in steps), default=None),
        last_t=max((t for t, _ in steps), default=None),
    )


def read_progress(path: Path) -> Progress:
    return progress(read_events(path))


def progressing(p: Progress) -> bool:
    """At least two distinct steps reported: the job is running, not just started."""
    return p.steps_seen >= 2 and p.max_step >= 1
