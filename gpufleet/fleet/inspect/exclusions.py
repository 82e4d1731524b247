"""Jobs that excluded a node (pure): the lemon rule's second signal (lemon.py; Meta counts the
jobs whose users excluded a node, Kokolis et al. HPCA 2025). Read from `scontrol -o show job`
(ExcNodeList, SubmitTime), which keeps a finished job for MinJobAge seconds; a cluster with
accounting would read `sacct -X -P -o JobID,ExcNodeList,Submit` for the whole week instead."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gpufleet.core.slurm_state import expand_hostlist, parse_slurm_time


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
