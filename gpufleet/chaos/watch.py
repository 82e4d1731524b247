"""Background pollers, started at the first injection of a run and bounded in time: the scheduler's
node states (isolation and return times as they happen) and, where the workload is pods, the
training job's pods (interrupted and resumed times)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from gpufleet.chaos.backends.base import TrainingPods
from gpufleet.chaos.scheduler import Transition, transitions
from gpufleet.core.slurm_state import NodeObs

logger = logging.getLogger("chaostoolkit")
T = TypeVar("T")


class Poller(Generic[T]):
    """Samples `sample()` every `interval` seconds in a thread; a failed sample is a gap, counted."""

    name = "gpufleet-poller"

    def __init__(self, sample: Callable[[], T], interval: float = 0.5, max_seconds: float = 1800.0) -> None:
        self._sample = sample
        self.interval = interval
        self.max_seconds = max_seconds
        self.samples: list[tuple[float, T]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        try:
            obs = self._sample()
        except Exception as e:  # a failed poll is a gap, reported in the count, not a crash
            self.errors += 1
            logger.debug("%s poll failed: %s", self.name, e)
            return
        with self._lock:
            self.samples.append((time.time(), obs))

    def start(self) -> None:
        self.poll_once()  # baseline before the fault
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.wait(self.interval) and time.monotonic() < deadline:
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> list[tuple[float, T]]:
        with self._lock:
            return list(self.samples)


class SchedulerWatcher(Poller[dict[str, NodeObs]]):
    name = "gpufleet-scheduler-watch"

    def baseline(self) -> dict[str, bool]:
        s = self.snapshot()
        return {n: o.schedulable for n, o in s[0][1].items()} if s else {}

    def transitions(self) -> list[Transition]:
        return transitions(self.snapshot())

    def latest(self) -> dict[str, NodeObs]:
        s = self.snapshot()
        return s[-1][1] if s else {}


class PodWatcher(Poller[TrainingPods]):
    """The training job's pods (Backend.training_pods), for a backend whose workload is pods."""

    name = "gpufleet-pod-watch"

    def latest(self) -> TrainingPods | None:
        s = self.snapshot()
        return s[-1][1] if s else None
