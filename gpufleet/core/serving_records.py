"""Serving load records: the JSONL files the load generator's processes write (one per process,
`requests-<pid>.jsonl`) and every reader of them (the chaos probes, the benchmark) parse with this
one model. One line per request the schedule asked for: sent (with its latency and status) or
missed (the user was still waiting on its previous request when the slot was due; see
gpufleet.slo.serving on coordinated omission). Torn lines are skipped; a complete line that does not
fit the model is an error naming the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gpufleet.core.jsonl import READ_LIMIT_BYTES, parse_models, read_lines

RECORDS_GLOB = "requests-*.jsonl"


class RequestLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float  # when the schedule asked for the request (wall clock)
    latency_s: float | None = None  # from `t` to the answer (None: missed)
    ok: bool
    missed: bool = False
    status: int | None = None  # HTTP status; 0 = no answer (connection failed or timed out)
    replica: str | None = None  # the X-Replica header of the answer
    error: str | None = None

    def line(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True) + "\n"


def parse_records(lines: Iterable[str | bytes], source: str) -> list[RequestLine]:
    return parse_models(lines, RequestLine, source, "a request record")


def read_records(directory: Path, limit_bytes: int = READ_LIMIT_BYTES) -> dict[str, list[RequestLine]]:
    """Every process's records in `directory`, by file name (none when nothing was written yet)."""
    return {p.name: parse_records(read_lines(p, limit_bytes), str(p))
            for p in sorted(directory.glob(RECORDS_GLOB))}
