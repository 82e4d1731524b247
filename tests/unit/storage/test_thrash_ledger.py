"""The thrasher's steps through the real engine and fault ledger, on a stand-in for Ceph (what `ceph
osd out/in/down` and the daemons do to each OSD's up/in flags, and PGs clean whenever the state
allows it): every change is a ledger entry written before it is applied, entries close as the
thrasher undoes them, and after restore_all nothing is pending and every OSD is up and in."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from osd_state_support import three_osd_state

from gpufleet.chaos import engine
from gpufleet.chaos.storage import thrash
from gpufleet.chaos.storage.thrash_policy import Move, choose, within
from gpufleet.core.storage_contract import write_storage_state

STACKS = Path(__file__).parents[3] / "stacks"


class FakeCeph:
    def __init__(self) -> None:
        self.alive = {0: True, 1: True, 2: True}
        self.up = {0: True, 1: True, 2: True}
        self.inn = {0: True, 1: True, 2: True}
        self.applied_after_record: list[bool] = []

    def run(self, state: Any, *args: str, **_: Any) -> str:
        verb, osd = args[1], int(args[2])
        if verb == "out":
            self.inn[osd] = False
        elif verb == "in":
            self.inn[osd] = True
        elif verb == "down":
            self.up[osd] = False
        return ""

    def osd_states(self, state: Any) -> dict[int, tuple[bool, bool]]:
        for o in self.up:  # a live OSD marked down says "wrongly marked me down" and comes back
            self.up[o] = self.alive[o]
        return {o: (self.up[o], self.inn[o]) for o in self.up}

    def pg_summary(self, state: Any) -> tuple[bool, bool, bool, dict[str, int]]:
        up_in = [o for o in self.up if self.up[o] and self.inn[o]]
        dead_in = [o for o in self.up if not self.alive[o] and self.inn[o]]
        clean = len(up_in) >= 2 and not dead_in
        return True, clean, clean, {"active+clean" if clean else "active+undersized+degraded": 32}


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[dict[str, Any]]:
    state = three_osd_state(tmp_path, "sandbox-storage", "checkpoints", lambda i: ["ceph-osd", "-i", str(i)],
                            2**22 - 5)
    write_storage_state(state, tmp_path)
    engine.end_runs()
    yield {
        "gpufleet_backend": "storage",
        "gpufleet_stack": "sandbox-storage",
        "gpufleet_stacks_dir": str(STACKS),
        "gpufleet_sandbox_root": str(tmp_path),
        "gpufleet_ledger": str(tmp_path / "faults.jsonl"),
    }
    engine.end_runs()


@pytest.mark.parametrize("seed", [1, 2, 3, 20261205])
def test_every_change_is_ledgered_first_and_nothing_is_left_pending(
    cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    ceph = FakeCeph()
    ledger = engine.context(cfg).ledger
    monkeypatch.setattr(thrash, "ceph_run", ceph.run)
    monkeypatch.setattr(thrash, "_osd_states", ceph.osd_states)
    monkeypatch.setattr(thrash, "_pg_summary", ceph.pg_summary)
    monkeypatch.setattr(thrash, "POLL_S", 0.0)

    def kill(self: thrash.Thrasher, osd: int) -> dict[str, Any]:
        # The ledger already names this change when the daemon is killed.
        ceph.applied_after_record.append(
            bool(ledger.records()) and ledger.records()[-1].target == {"osd": osd}
        )
        ceph.alive[osd] = ceph.up[osd] = False
        return {"pid": 0}

    def revive(self: thrash.Thrasher, osd: int) -> None:
        ceph.alive[osd] = ceph.up[osd] = True

    monkeypatch.setattr(thrash.Thrasher, "_kill", kill)
    monkeypatch.setattr(thrash.Thrasher, "_revive", revive)
    t = thrash.Thrasher(cfg, thrash.ThrashSettings(seed=seed, settle_timeout_s=5))
    rng = random.Random(seed)
    t.rng = rng
    for _ in range(25):
        action = choose(rng, t.view, t.limits)
        if action is None:
            t.refresh_marked_down()
            continue
        t.step(action)
        assert within(t.view, t.limits)
        pending = {r.id for r in ledger.pending() if r.kind == "osd-thrash"}
        assert pending == set(t.ledgered.open), (pending, t.ledgered.open)
    t.restore_all()
    records = [r for r in ledger.records() if r.kind == "osd-thrash"]
    assert [r.id for r in records] == [c.ledger_id for c in t.changes]
    assert all(r.rollback.name == "storage.thrash-revert" for r in records)
    assert [r for r in ledger.pending() if r.kind == "osd-thrash"] == []
    assert all(ceph.alive.values()) and all(ceph.up.values()) and all(ceph.inn.values())
    assert all(ceph.applied_after_record)
    assert {c.move for c in t.changes} >= {Move.OUT.value, Move.IN.value}
    assert all(c.clean_at is not None for c in t.changes if c.clean_reachable)
