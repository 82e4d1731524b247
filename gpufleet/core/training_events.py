"""Training events: the JSONL file the training ranks append to and every reader of it (the sandbox's
status, the auto-resume controller, the chaos probes, the steady-state check, the timeline) parse
with this one model.

One JSON object per line, appended with a single O_APPEND write (lines never interleave). A line
being appended right now may be torn: it is not JSON yet and is skipped. A complete line that does not
fit the model is an error, not ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpufleet.core.jsonl import READ_LIMIT_BYTES, parse_models, read_lines

EventName = Literal["start", "step", "checkpoint", "checkpoint_failed", "resume", "exit", "error"]


class TrainingEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float  # wall clock (time.time()) of the event
    event: EventName
    step: int | None = None  # the optimizer step the event is about (none: start, some errors)
    restart: int  # the incarnation (GPUFLEET_INCARNATION): 0, then one more per resubmission
    job_id: int  # the Slurm job of this incarnation
    node: str
    rank: int
    # Details, by event. start:
    world_size: int | None = None
    host: str | None = None
    pid: int | None = None
    # step:
    loss: float | None = None
    # checkpoint / resume:
    checkpoint: str | None = None
    bytes: int | None = None
    write_seconds: float | None = None
    from_job: int | None = None
    from_restart: int | None = None
    # checkpoint_failed / error / exit:
    errno: str | None = None
    message: str | None = None
    reason: str | None = None
    final_loss: float | None = None

    def line(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True) + "\n"


def parse_events(lines: Iterable[str | bytes], source: str = "training events") -> list[TrainingEvent]:
    """Events from JSONL lines: torn (not yet JSON) lines are skipped; a JSON line that does not fit
    the model raises ValueError naming `source`, the line number and what is wrong."""
    return parse_models(lines, TrainingEvent, source, "a training event")


def read_events(path: str | Path, limit_bytes: int = READ_LIMIT_BYTES) -> list[TrainingEvent]:
    """The events of a file (none when it does not exist yet)."""
    return parse_events(read_lines(path, limit_bytes), str(path))
