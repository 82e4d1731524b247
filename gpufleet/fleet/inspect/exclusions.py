"""Jobs that excluded a node (pure): the lemon rule's second signal (lemon.py; Meta counts the
jobs whose users excluded a node, Kokolis et al. HPCA 2025). Read from `scontrol -o show job`
(ExcNodeList, SubmitTime), which keeps a finished job for MinJobAge seconds; a cluster with
accounting would read `sacct -X -P -o JobID,ExcNodeList,Submit` for the whole week instead."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from gpufleet.core.slurm_state import parse_slurm_time

_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: `gpu-[0-2,5],spare-1` -> gpu-0, gpu-1, gpu-2, gpu-5, spare-1
    (one bracket per name, as Slurm prints lists of `<prefix><number>` nodes; zero padding kept)."""
    out: list[str] = []
    parts, depth, cur = [], 0, ""
    for ch in text.strip():
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    parts.append(cur)
    for part in (p for p in parts if p):
        m = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", part)
        if m is None:
            out.append(part)
            continue
        prefix, body, suffix = m.groups()
        for item in body.split(","):
            r = _RANGE.match(item)
            if r is None:
                out.append(f"{prefix}{item}{suffix}")
                continue
            width = len(r[1])
            out += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(r[1]), int(r[2]) + 1)]
    return out


def job_exclusions(scontrol_jobs: str, since: Mapping[str, float], default_since: float = 0.0
                   ) -> dict[str, int]:
    """Per node, the jobs submitted after `since[node]` (its previous sweep) whose ExcNodeList
    names it; every job is counted once per node, so sweeps never count one job twice."""
    out: Counter[str] = Counter()
    for line in scontrol_jobs.splitlines():
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        exc = kv.get("ExcNodeList", "")
        if not exc or exc == "(null)":
            continue
        submitted = parse_slurm_time(kv.get("SubmitTime", ""))
        if submitted is None:
            continue
        for node in expand_hostlist(exc):
            if submitted > since.get(node, default_since):
                out[node] += 1
    return dict(out)
