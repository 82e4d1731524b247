"""Background scheduler poller, started at the first injection of a run: node states are sampled
every `interval` seconds (bounded in time) so isolation and return times are seen as they happen."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpufleet.chaos.scheduler import Transition, transitions
from gpufleet.core.slurm_state import NodeObs

logger = logging.getLogger("chaostoolkit")


class SchedulerWatcher:
    def __init__(
        self, sample: Callable[[], dict[str, NodeObs]], interval: float = 0.5, max_seconds: float = 1800.0
    ) -> None:
        self._sample = sample
        self.interval = interval
        self.max_seconds = max_seconds
        self.samples: list[tuple[float, dict[str, NodeObs]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        try:
            obs = self._sample()
        except Exception as e:  # a failed poll is a gap, reported in the count, not a crash
            self.errors += 1
            logger.debug("scheduler poll failed: %s", e)
            return
        with self._lock:
            self.samples.append((time.time(), obs))

    def start(self) -> None:
        self.poll_once()  # baseline before the fault
        self._thread = threading.Thread(target=self._loop, name="gpufleet-scheduler-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.wait(self.interval) and time.monotonic() < deadline:
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> list[tuple[float, dict[str, NodeObs]]]:
        with self._lock:
            return list(self.samples)

    def baseline(self) -> dict[str, bool]:
        s = self.snapshot()
        return {n: o.schedulable for n, o in s[0][1].items()} if s else {}

    def transitions(self) -> list[Transition]:
        return transitions(self.snapshot())

    def latest(self) -> dict[str, NodeObs]:
        s = self.snapshot()
        return s[-1][1] if s else {}
