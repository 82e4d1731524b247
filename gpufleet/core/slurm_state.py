"""Slurm node states as every layer reads them: `sinfo` output parsed into NodeObs (pure). One home
for the sandbox (is every node idle?), the chaos backends (what is unschedulable?) and the steady
state check (gpufleet.chaos.steady)."""

from __future__ import annotations

import calendar
import re
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
    # The node reports a problem of its own (Kubernetes: the node-health condition is True, or the
    # node is not Ready), schedulable or not; Slurm's sinfo has no such state, so always False there.
    problem: bool = False
    problem_since: float | None = None  # when the reporting condition changed to its value

    @property
    def responding(self) -> bool:
        """A trailing `*` on the state: the node does not answer slurmctld's pings (sinfo(1))."""
        return not self.state.endswith("*")

    @property
    def base_state(self) -> str:
        """The state without its flag characters, lower case (`down*` -> `down`)."""
        return self.state.strip().lower().rstrip("*~#!%$@^-")


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


# --------------------------------------------------------------------------- hostlists


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist as `scontrol show hostnames` does: `n[01-03,7]` -> n01 n02 n03 n7.

    Zero padding of a range is kept; several bracket groups in one name multiply out."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        out += _expand_one(item)
    return out


def _split_top(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    items.append(cur)
    return [i for i in items if i]


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    heads: list[str] = []
    for part in ranges.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ValueError(f"bad range {part!r} in hostlist item {item!r}")
            width = len(lo) if lo.startswith("0") else 0
            heads += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        elif part.isdigit():
            heads.append(prefix + part)
        else:
            raise ValueError(f"bad element {part!r} in hostlist item {item!r}")
    return [h + tail for h in heads for tail in _expand_one(rest)]
