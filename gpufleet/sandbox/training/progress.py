"""What a rank reports: JSONL events, Prometheus metrics (rank 0) and its file_sd target; the GPU
health it must obey (the node agent's gpu-health.json) is gpufleet.sandbox.gpu_health's."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.core.training_events import EventName, TrainingEvent


@dataclass(frozen=True)
class EventContext:
    job_id: int
    restart: int
    node: str
    rank: int


def event_line(ctx: EventContext, event: EventName, step: int | None, t: float, **extra: Any) -> str:
    """One line of the events file (the model refuses an unknown event or detail)."""
    return TrainingEvent(t=round(t, 3), event=event, step=step, restart=ctx.restart, job_id=ctx.job_id,
                         node=ctx.node, rank=ctx.rank, **extra).line()


class EventLog:
    """Appends one JSON line per event with a single O_APPEND write (lines never interleave)."""

    def __init__(self, path: Path, ctx: EventContext, step_interval_s: float = 1.0) -> None:
        self.path, self.ctx, self.step_interval_s = path, ctx, step_interval_s
        path.parent.mkdir(parents=True, exist_ok=True)
        self._last_step_t: float | None = None

    def emit(self, event: EventName, step: int | None, **extra: Any) -> None:
        t = time.time()
        line = event_line(self.ctx, event, step, t, **extra)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def step(self, step: int, *, force: bool = False, **extra: Any) -> bool:
        """Record a step event: the first after a (re)start always, then at most once per interval."""
        now = time.monotonic()
        if not force and self._last_step_t is not None and now - self._last_step_t < self.step_interval_s:
            return False
        self._last_step_t = now
        self.emit("step", step, **extra)
        return True


class TrainingProgress:
    """Thread-safe figures rank 0 exports."""

    def __init__(self, job_id: int, job_name: str, world_size: int, restarts: int) -> None:
        self._lock = threading.Lock()
        self.labels = {"slurm_job_id": str(job_id), "job_name": job_name}
        self.world_size, self.restarts = world_size, restarts
        self.step = 0
        self.samples_per_second = 0.0
        self.last_checkpoint_step = -1
        self.checkpoint_failures = 0  # writes that failed with an I/O error (this incarnation)

    def update(self, **kv: float | int) -> None:
        with self._lock:
            for k, v in kv.items():
                setattr(self, k, v)

    def values(self) -> dict[str, float]:
        with self._lock:
            return {"step": self.step, "samples_per_second": self.samples_per_second,
                    "last_checkpoint_step": self.last_checkpoint_step, "restarts": self.restarts,
                    "world_size": self.world_size, "checkpoint_failures": self.checkpoint_failures}


class TrainingCollector(Collector):
    def __init__(self, progress: TrainingProgress) -> None:
        self.progress = progress

    def collect(self) -> Iterable[Metric]:
        v = self.progress.values()
        names = list(self.progress.labels)
        vals = list(self.progress.labels.values())

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(vals, value)
            return g

        restarts = CounterMetricFamily("gpufleet_training_restarts", "Times the job was requeued "
                                       "(SLURM_RESTART_COUNT).", labels=names)
        restarts.add_metric(vals, v["restarts"])
        # A counter per incarnation (it starts at 0 after a requeue; increase() handles the reset):
        # the signal of the catalog's StorageCheckpointWriteFailing alert.
        ckpt_failures = CounterMetricFamily("gpufleet_training_checkpoint_failures", "Checkpoint writes "
                                            "that failed with an I/O error (EROFS, EIO, ...); training "
                                            "went on.", labels=names)
        ckpt_failures.add_metric(vals, v["checkpoint_failures"])
        return [
            gauge("gpufleet_training_step", "Training steps completed.", v["step"]),
            gauge("gpufleet_training_samples_per_second", "Training throughput over recent steps.",
                  v["samples_per_second"]),
            gauge("gpufleet_training_last_checkpoint_step", "Step of the last checkpoint written "
                  "or resumed (-1: none).", v["last_checkpoint_step"]),
            restarts,
            ckpt_failures,
            gauge("gpufleet_training_world_size", "Ranks in the job.", v["world_size"]),
        ]


def file_sd_doc(target: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [{"targets": [target], "labels": labels}]


def write_file_sd(path: Path, target: str, labels: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(file_sd_doc(target, labels), indent=1))
    os.replace(tmp, path)  # Prometheus re-reads file_sd files on change; never a half-written one
