"""`ceph pg stat` counted as Ceph's own test suite counts it: active and clean whatever else a PG shows."""

from __future__ import annotations

from typing import Any

from gpufleet.core.ceph_admin import pg_counts


def _stat(states: dict[str, int], wrapped: bool = True) -> dict[str, Any]:
    summary = {"num_pg_by_state": [{"name": k, "num": v} for k, v in states.items()],
               "num_pgs": sum(states.values())}
    return {"pg_summary": summary} if wrapped else summary


def test_scrubbing_and_snaptrim_pgs_are_clean() -> None:
    c = pg_counts(_stat({"active+clean": 60, "active+clean+scrubbing+deep": 3, "active+clean+snaptrim": 1}))
    assert (c.total, c.active, c.clean) == (64, 64, 64)
    assert c.all_active and c.all_clean


def test_degraded_peering_and_stale_pgs_are_not_clean() -> None:
    c = pg_counts(_stat({"active+clean": 50, "active+undersized+degraded": 8, "peering": 4,
                         "stale+active+clean": 2}, wrapped=False))
    assert (c.total, c.active, c.clean) == (64, 60, 50)
    assert not c.all_active and not c.all_clean


def test_no_pgs_is_neither_active_nor_clean() -> None:
    c = pg_counts({"pg_summary": {"num_pg_by_state": [], "num_pgs": 0}})
    assert not c.all_active and not c.all_clean
