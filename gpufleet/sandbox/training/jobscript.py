"""The sbatch script of the sandbox training job (JobParams -> script text, jinja2)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import jinja2
from pydantic import BaseModel, ConfigDict, Field, field_validator

_TEMPLATES = Path(__file__).parent


class JobParams(BaseModel):
    """Everything the job script and the ranks need. Paths must be absolute (no PATH, no cwd)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str  # the venv's interpreter (sys.executable of the submitter)
    base_dir: str  # sandbox run directory; ranks read <base_dir>/nodes/<node>/gpu-health.json
    checkpoint_dir: str
    checkpoint_s3: str | None = None  # the S3 location file: checkpoints to its bucket prefix instead
    events_file: str
    file_sd_dir: str  # Prometheus file_sd directory: rank 0 writes its own target there
    hosts_file: str  # JSON: node -> {"mgmt_ip", "fabric_ip", "fabric_ifname"}
    nodes: Annotated[int, Field(ge=1)] = 2
    ranks_per_node: Annotated[int, Field(ge=1, le=16)] = 1
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = 20
    step_sleep_seconds: Annotated[float, Field(ge=0)] = 0.05
    max_steps: Annotated[int, Field(ge=1)] = 1_000_000
    pg_timeout: Annotated[float, Field(gt=0, le=600)] = 10.0  # gloo analogue of the NCCL watchdog
    seed: int = 1234
    batch_size: Annotated[int, Field(ge=1)] = 32
    keep_checkpoints: Annotated[int, Field(ge=1)] = 3
    rendezvous_port: Annotated[int, Field(ge=1024, le=64000)] = 29500
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9410
    srun: str = "/usr/bin/srun"

    @field_validator("python", "base_dir", "checkpoint_dir", "checkpoint_s3", "events_file", "file_sd_dir",
                     "hosts_file", "srun")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_absolute():
            raise ValueError(f"must be an absolute path (jobs get no PATH or cwd): {v!r}")
        return v


def train_args(p: JobParams) -> list[str]:
    """Command-line flags of `python -m gpufleet.sandbox.training.train` for these params."""
    return [
        "--base-dir", p.base_dir,
        "--checkpoint-dir", p.checkpoint_dir,
        "--events-file", p.events_file,
        "--file-sd-dir", p.file_sd_dir,
        "--hosts-file", p.hosts_file,
        "--checkpoint-every", str(p.checkpoint_every_steps),
        "--step-sleep", repr(p.step_sleep_seconds),
        "--max-steps", str(p.max_steps),
        "--pg-timeout", repr(float(p.pg_timeout)),
        "--seed", str(p.seed),
        "--batch-size", str(p.batch_size),
        "--keep-checkpoints", str(p.keep_checkpoints),
        "--rendezvous-port", str(p.rendezvous_port),
        "--metrics-port", str(p.metrics_port),
    ] + (["--checkpoint-s3", p.checkpoint_s3] if p.checkpoint_s3 else [])


def render_job_script(params: JobParams) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env.get_template("job.sh.j2").render(p=params, train_args=train_args(params))
