"""The bundle's manifest: one typed record per collector, written into the archive beside its output
and read back by `gpufleet bundle show`, the game-day report and the inspect report."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION: Literal[1] = 1

# ok: exit 0 (or the file/endpoint was read); failed: non-zero exit, tool missing, read error;
# timeout: killed at its per-collector timeout or cut off at the bundle's deadline;
# dropped: ran, but its output did not fit under the bundle's total size cap.
Status = Literal["ok", "failed", "timeout", "dropped"]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Caps(_M):
    """Bounds on one bundle (defaults and their reasons: caps.py)."""

    collector_timeout_s: float = Field(gt=0)
    collector_bytes: int = Field(gt=0)
    total_bytes: int = Field(gt=0)
    deadline_s: float = Field(gt=0)  # the whole collection, all collectors running at once


class Member(_M):
    """One collector's run and, unless it produced nothing, its file in the archive."""

    collector: str
    name: str | None  # path inside the archive; None when nothing was kept
    command: list[str]  # argv, or a description of the read ("GET /state", "file <path>")
    status: Status
    exit_status: int | None  # of the command; None when it did not exit by itself or is no command
    duration_s: float
    size: int = 0  # bytes kept in the archive
    sha256: str | None = None
    truncated: bool = False  # the output was longer than the collector's byte cap
    error: str | None = None


class Manifest(_M):
    version: Literal[1] = MANIFEST_VERSION
    node: str
    stack: str | None
    source: str  # "sandbox" or a vendor table ("nvidia", "amd", "ascend")
    trigger: str  # "node-health", "inspect", "manual", "benchmark"
    reason: str | None = None  # the fault that triggered it (drain reason)
    detected_at: float | None = None  # when the fault was detected (the trigger's clock)
    started_at: float
    finished_at: float
    window: tuple[float, float] | None = None  # metrics/log window collected (unix seconds)
    caps: Caps
    members: list[Member]

    def member(self, collector: str) -> Member:
        for m in self.members:
            if m.collector == collector:
                return m
        raise KeyError(f"no collector {collector!r} in the manifest")

    @property
    def total_bytes(self) -> int:
        return sum(m.size for m in self.members)
