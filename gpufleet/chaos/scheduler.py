"""Scheduler observations: pure parsing of Slurm output and node-state classification."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass

# `sinfo -h -N -o <SINFO_FORMAT>`: node, long state, reason, reason timestamp (sinfo(1): %N, %T, %E, %H).
SINFO_FORMAT = "%N|%T|%E|%H"
SINFO_ARGS = ("sinfo", "-h", "-N", "-o", SINFO_FORMAT)

# Long states that keep a node out of scheduling (sinfo(1) "NODE STATE CODES").
_UNAVAILABLE = ("down", "drain", "fail", "maint", "reboot", "power", "unknown", "future", "inval")


@dataclass(frozen=True)
class NodeObs:
    name: str
    state: str  # as reported, e.g. "drained", "down*", "idle"
    reason: str
    reason_time: float | None  # Unix seconds the reason was set (Slurm %H), if any
    schedulable: bool


def schedulable(state: str) -> bool:
    """A Slurm node state is schedulable when it is not down/drained/failing and responds (no `*`)."""
    s = state.strip().lower()
    if s.endswith("*") or s.endswith("~") or s.endswith("#") or s.endswith("!") or s.endswith("%"):
        return False
    return not any(s.startswith(u) or f"+{u}" in s for u in _UNAVAILABLE)


def parse_slurm_time(text: str, tz_offset: float | None = None) -> float | None:
    """Slurm prints local time `YYYY-MM-DDTHH:MM:SS`; None for "Unknown"/"None"/empty."""
    text = text.strip()
    if not text or text.lower() in ("unknown", "none", "n/a"):
        return None
    try:
        tm = time.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    if tz_offset is None:
        return time.mktime(tm)
    return calendar.timegm(tm) - tz_offset


def parse_sinfo(text: str) -> dict[str, NodeObs]:
    out: dict[str, NodeObs] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 4:
            continue
        name, state, reason, when = parts[0].strip(), parts[1].strip(), parts[2].strip(), parts[3]
        reason = "" if reason.lower() == "none" else reason
        out[name] = NodeObs(name, state, reason, parse_slurm_time(when), schedulable(state))
    return out


@dataclass(frozen=True)
class Transition:
    at: float
    node: str
    schedulable: bool
    state: str
    reason: str
    reason_time: float | None


def transitions(samples: list[tuple[float, dict[str, NodeObs]]]) -> list[Transition]:
    """Schedulability changes between successive samples (the first sample is the baseline)."""
    out: list[Transition] = []
    prev: dict[str, bool] = {}
    for i, (t, nodes) in enumerate(samples):
        for name, obs in sorted(nodes.items()):
            was = prev.get(name)
            if i > 0 and was is not None and was != obs.schedulable:
                out.append(Transition(t, name, obs.schedulable, obs.state, obs.reason, obs.reason_time))
            prev[name] = obs.schedulable
    return out
