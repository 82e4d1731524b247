"""Ceph admin commands against a storage sandbox (`ceph -c <its conf> ... --format json`), once for
the sandbox's bring-up, the chaos backend, its rollbacks and probes."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from gpufleet.core.storage_contract import StorageSandboxState


class CephCommandError(RuntimeError):
    """A `ceph` command failed or did not answer; the message has its argv and stderr."""


def ceph_run(state: StorageSandboxState, *args: str, timeout_s: float = 60.0) -> str:
    argv = state.ceph_command(*args)
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CephCommandError(f"`{' '.join(argv)}` did not answer in {timeout_s:.0f} s") from None
    if res.returncode != 0:
        err = (res.stderr or res.stdout).strip()[-600:]
        raise CephCommandError(f"`{' '.join(argv)}` failed (exit {res.returncode}): {err}")
    return res.stdout


def ceph_json(state: StorageSandboxState, *args: str, timeout_s: float = 60.0) -> dict[str, Any]:
    out = ceph_run(state, *args, timeout_s=timeout_s)
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError as e:
        raise CephCommandError(f"ceph {' '.join(args)}: not JSON: {e}: {out[:200]}") from None
    if not isinstance(doc, dict):
        raise CephCommandError(f"ceph {' '.join(args)}: not a JSON object: {out[:200]}")
    return doc


@dataclass(frozen=True)
class PgCounts:
    """`ceph pg stat`'s placement groups: how many in all, active, and active and clean."""

    total: int
    active: int
    clean: int
    by_state: dict[str, int]

    @property
    def all_active(self) -> bool:
        return self.total > 0 and self.active == self.total

    @property
    def all_clean(self) -> bool:
        return self.total > 0 and self.clean == self.total


def pg_counts(pg_stat: dict[str, Any]) -> PgCounts:
    """Count the PGs of a `ceph pg stat --format json` answer. A PG is clean when its state has both
    `active` and `clean` and not `stale`, whatever else it shows (Ceph's own test suite counts them so,
    qa/tasks/ceph_manager.py num_active_clean): `active+clean+scrubbing+deep` is clean; only the exact
    name `active+clean` is not enough (seen here: a thrash change that never saw all PGs clean within
    120 s while Ceph said HEALTH_OK, its PGs scrubbing)."""
    summary = pg_stat.get("pg_summary", pg_stat)
    by_state = {str(s["name"]): int(s["num"]) for s in summary.get("num_pg_by_state", [])}
    active = clean = 0
    for name, n in by_state.items():
        parts = set(name.split("+"))
        if "active" in parts:
            active += n
            if "clean" in parts and "stale" not in parts:
                clean += n
    return PgCounts(total=int(summary.get("num_pgs", 0)), active=active, clean=clean, by_state=by_state)
