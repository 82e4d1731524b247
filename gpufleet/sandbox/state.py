"""Keeping the state file (gpufleet.core.sandbox_contract) true at every moment of `up`.

Each change is written at once (atomic replace), and names are recorded BEFORE the kernel object
or process they name is created, so the file always covers everything that may exist.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.sandbox_contract import (
    SandboxNode,
    SandboxProcess,
    SandboxState,
    read_state,
    state_path,
    write_state,
)


class Recorder:
    """Thread-safe holder of the run's SandboxState; every mutation is persisted."""

    def __init__(self, state: SandboxState, root: Path | None = None) -> None:
        self._state = state
        self._root = root
        self._lock = threading.RLock()  # add_* read and update under one hold (no lost update)
        self.path = write_state(state, root)

    @property
    def state(self) -> SandboxState:
        with self._lock:
            return self._state.model_copy(deep=True)

    def update(self, **fields: object) -> None:
        with self._lock:
            self._state = self._state.model_copy(update=fields)
            # model_copy(update=) skips validation: validate by round-tripping.
            self._state = SandboxState.model_validate(self._state.model_dump())
            write_state(self._state, self._root)

    def add_names(self, kind: str, names: list[str]) -> None:
        with self._lock:
            current: list[str] = list(getattr(self._state, kind))
            merged = current + [n for n in names if n not in current]
            self.update(**{kind: merged})

    def add_process(self, proc: SandboxProcess) -> None:
        with self._lock:
            self.update(processes=[*self._state.processes, proc])

    def set_nodes(self, nodes: list[SandboxNode]) -> None:
        self.update(nodes=nodes)


def new_state(stack: str, run_id: str, base_dir: Path) -> SandboxState:
    return SandboxState(
        stack=stack, run_id=run_id, phase="creating", base_dir=str(base_dir), created_at=time.time()
    )


@dataclass(frozen=True)
class Existing:
    state: SandboxState | None
    error: str | None


def existing(stack: str, root: Path | None = None) -> Existing:
    """The state of a stack's sandbox, if a state file exists (error if it is unreadable)."""
    path = state_path(stack, root)
    if not path.exists():
        return Existing(None, None)
    try:
        return Existing(read_state(stack, root), None)
    except (OSError, ValueError) as e:
        return Existing(None, f"{path}: {e}")
