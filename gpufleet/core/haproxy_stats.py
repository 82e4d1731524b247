"""HAProxy's view of its servers, from its `/stats;csv` page: read by the sandbox (waiting for the
replicas at bring-up) and by the chaos layer (steady state, a replica out of the rotation), so it
lives here once. Column names are those of HAProxy 2.6's management guide, section 9.1 (CSV)."""

from __future__ import annotations

import urllib.error
import urllib.request

from gpufleet.core.netns import run_in
from gpufleet.core.slurm_state import NodeObs

BACKEND = "replicas"  # the backend (pxname) the sandbox's haproxy.cfg puts the replicas in


def parse_server_column(csv_text: str, column: str, backend: str = BACKEND) -> dict[str, str]:
    """Server name -> the value of `column` (status, scur, check_status, ...) for `backend`'s servers."""
    rows = [line for line in csv_text.splitlines() if line.strip()]
    if not rows or not rows[0].startswith("# "):
        raise ValueError("not HAProxy stats CSV (no '# pxname,...' header)")
    header = rows[0][2:].split(",")
    col = {name: i for i, name in enumerate(header)}
    if not {"pxname", "svname", column} <= col.keys():
        raise ValueError(f"HAProxy stats CSV lacks pxname/svname/{column} columns")
    out: dict[str, str] = {}
    for line in rows[1:]:
        f = line.split(",")
        if len(f) < len(header):
            continue
        if f[col["pxname"]] == backend and f[col["svname"]] not in ("FRONTEND", "BACKEND"):
            out[f[col["svname"]]] = f[col[column]]
    return out


def parse_server_states(csv_text: str, backend: str = BACKEND) -> dict[str, str]:
    """Server name -> status (UP, DOWN, MAINT, DRAIN, 'UP 1/2', ...) of `backend`'s servers."""
    return parse_server_column(csv_text, "status", backend)


def stats_csv(stats_url: str, netns: str | None = None, timeout_s: float = 2.0) -> str:
    """The stats page, read from inside network namespace `netns` when given (raises OSError)."""

    def fetch() -> str:
        with urllib.request.urlopen(stats_url, timeout=timeout_s) as r:
            return str(r.read().decode())

    return fetch() if netns is None else run_in(netns, fetch)


def server_sessions(stats_url: str, netns: str | None = None) -> dict[str, int]:
    """Server name -> its current sessions (`scur`): requests it is serving now. Empty when the page
    cannot be read."""
    try:
        return {k: int(v or 0) for k, v in parse_server_column(stats_csv(stats_url, netns), "scur").items()}
    except (OSError, urllib.error.URLError, ValueError):
        return {}


def server_states(stats_url: str, netns: str | None = None, timeout_s: float = 2.0) -> dict[str, str]:
    """The servers' states read from `stats_url`, from inside network namespace `netns` when given
    (the sandbox's balancer listens in its head namespace). Empty when the page cannot be read."""

    try:
        return parse_server_states(stats_csv(stats_url, netns, timeout_s))
    except (OSError, urllib.error.URLError, ValueError):
        return {}


def in_rotation(status: str) -> bool:
    """HAProxy sends requests to a server whose status is UP (also "UP 1/3": up, failing checks it
    has not yet failed `fall` times) or "no check" (checks disabled: always in)."""
    return status.startswith("UP") or status == "no check"


def replica_states(states: dict[str, str], replicas: tuple[str, ...]) -> dict[str, NodeObs]:
    """The balancer's view as node states: a replica's node is schedulable while the balancer sends
    it requests. An unreadable stats page (no states) leaves every replica out, said so."""
    out = {}
    for name in replicas:
        status = states.get(name)
        why = ("the balancer's stats are unreadable" if not states
               else f"not in the balancer's backend {BACKEND}" if status is None
               else f"out of the balancer's rotation ({status})")
        ok = status is not None and in_rotation(status)
        out[name] = NodeObs(name, f"balancer:{status or 'unknown'}", "" if ok else why, None, ok)
    return out
