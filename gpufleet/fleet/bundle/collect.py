"""Collect one bundle: run the collectors under the caps, write the archive with its manifest."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.fleet.bundle.archive import members, write_bundle
from gpufleet.fleet.bundle.model import Caps, Manifest
from gpufleet.fleet.bundle.runner import Collector, run_all


@dataclass(frozen=True)
class Request:
    """Who and why: written into the manifest as given."""

    node: str
    stack: str | None
    source: str
    trigger: str
    reason: str | None = None
    detected_at: float | None = None
    window: tuple[float, float] | None = None


def collect(req: Request, collectors: Sequence[Collector], caps: Caps, out_dir: Path
            ) -> tuple[Path, Manifest]:
    names = [c.name for c in collectors]
    if len(set(names)) != len(names) or len({c.member for c in collectors}) != len(collectors):
        raise ValueError(f"collector names and members must be unique: {names}")
    started = time.time()
    outputs = run_all(collectors, caps.collector_timeout_s, caps.collector_bytes, caps.deadline_s)
    records, files = members(collectors, outputs, caps)
    manifest = Manifest(node=req.node, stack=req.stack, source=req.source, trigger=req.trigger,
                        reason=req.reason, detected_at=req.detected_at, started_at=started,
                        finished_at=time.time(), window=req.window, caps=caps, members=records)
    return write_bundle(out_dir, manifest, files), manifest
