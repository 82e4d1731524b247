"""What a process on a sandbox node's GPUs must obey: the node agent's gpu-health.json (pure reader).

Read by the training ranks (every step) and the serving replicas (every request and readiness
probe): a fatal fault on a GPU fails every process on it, as a real GPU fault does; a hung GPU
(`hung_since`) completes no work, so a process on it blocks until the GPU is reset."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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


def gpu_hung(doc: Any, gpus: int | Iterable[int]) -> bool:
    """True when any of `gpus` is hung: its work never completes, and no error says so."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), dict):
        return False
    for gpu in [gpus] if isinstance(gpus, int) else gpus:
        entry = doc["gpus"].get(str(gpu))
        if isinstance(entry, dict) and isinstance(entry.get("hung_since"), int | float):
            return True
    return False


class GpuHealth:
    """Reads <node dir>/gpu-health.json, re-parsing only when it changed (checked every step)."""

    def __init__(self, path: Path, gpus: tuple[int, ...], started_at: float | None = None) -> None:
        self.path, self.gpus, self.started_at = path, gpus, started_at
        self._sig: tuple[int, int] | None = None
        self._error: str | None = None
        self._hung = False

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            # No agent on this node (e.g. a plain test run): nothing to obey.
            self._sig, self._error, self._hung = None, None, False
            return
        sig = (st.st_mtime_ns, st.st_ino)
        if sig != self._sig:
            try:
                doc = json.loads(self.path.read_text())
            except (OSError, ValueError):
                return  # replaced mid-read; the agent writes atomically, retry next step
            self._error = gpu_fault(doc, self.gpus, self.started_at)
            self._hung = gpu_hung(doc, self.gpus)
            self._sig = sig

    def error(self) -> str | None:
        self._refresh()
        return self._error

    def hung(self) -> bool:
        self._refresh()
        return self._hung

    def wait_while_hung(self, poll_s: float = 0.05) -> None:
        """Block while a GPU this process holds is hung, as a kernel launched on it never returns;
        a GPU reset (the agent's /clear) or a fatal fault (error()) ends the wait."""
        while self.hung() and self.error() is None:
            time.sleep(poll_s)
