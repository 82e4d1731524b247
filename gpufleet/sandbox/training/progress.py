"""What a rank reports: JSONL events, Prometheus metrics (rank 0), its file_sd target, and the
GPU health it must obey (the node agent's gpu-health.json)."""

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


def gpu_fault(doc: Any, gpus: int | Iterable[int], started_at: float | None = None) -> str | None:
    """The CUDA-like error a process holding `gpus` fails with, or None when they are all usable.

    A large job's rank holds every GPU the job was given on its node, and a fatal fault on any of them
    ends the process (NCCL's collectives over that GPU fail; gpu-faults.md). A fatal fault kills every
    process on the GPU. A fault that only kills the process that hit it (`kills_process`: a contained
    ECC error, an application error) fails a process that was already running when it happened
    (`since` >= `started_at`); one started afterwards runs normally."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), dict):
        return None
    for gpu in [gpus] if isinstance(gpus, int) else gpus:
        error = _one_gpu_fault(doc["gpus"].get(str(gpu)), gpu, started_at)
        if error is not None:
            return error
    return None


def _one_gpu_fault(entry: Any, gpu: int, started_at: float | None) -> str | None:
    if not isinstance(entry, dict):
        return None
    error = str(entry.get("error") or f"CUDA error: unspecified launch failure (GPU {gpu})")
    if entry.get("fatal") is True:
        return error
    since = entry.get("since")
    if (
        entry.get("kills_process") is True
        and started_at is not None
        and isinstance(since, int | float)
        and since >= started_at
    ):
        return error
    return None


class GpuHealth:
    """Reads <node dir>/gpu-health.json, re-parsing only when it changed (checked every step)."""

    def __init__(self, path: Path, gpus: tuple[int, ...], started_at: float | None = None) -> None:
        self.path, self.gpus, self.started_at = path, gpus, started_at
        self._sig: tuple[int, int] | None = None
        self._error: str | None = None

    def error(self) -> str | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None  # no agent on this node (e.g. a plain test run): nothing to obey
        sig = (st.st_mtime_ns, st.st_ino)
        if sig != self._sig:
            try:
                self._error = gpu_fault(json.loads(self.path.read_text()), self.gpus, self.started_at)
            except (OSError, ValueError):
                return self._error  # replaced mid-read; the agent writes atomically, retry next step
            self._sig = sig
        return self._error


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
