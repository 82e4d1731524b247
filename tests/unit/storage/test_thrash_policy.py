"""The OSD thrasher's decisions (pure): limits from size/min_size, seeded choices that never break
them, when the cluster can be clean, the distribution, and which S3 errors a change accounts for."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.chaos.storage.thrash import Ledgered
from gpufleet.chaos.storage.thrash_policy import (
    Action,
    Limits,
    Move,
    ThrashError,
    View,
    accounted,
    after,
    candidates,
    choose,
    clean_reachable,
    distribution,
    rejoined,
    windows,
    within,
)


@pytest.mark.parametrize(
    ("osds", "size", "min_size", "max_dead", "min_in"),
    [(3, 2, 1, 1, 2), (3, 3, 1, 2, 3), (3, 3, 2, 1, 3), (5, 3, 2, 1, 3), (4, 2, 2, 0, 2)],
)
def test_limits_come_from_size_and_min_size(
    osds: int, size: int, min_size: int, max_dead: int, min_in: int
) -> None:
    lim = Limits.for_pools(osds, size, min_size)
    assert (lim.max_dead, lim.min_in) == (max_dead, min_in)


@pytest.mark.parametrize(
    ("osds", "size", "min_size", "why"),
    [(3, 2, 2, None), (2, 2, 2, "nothing to thrash"), (2, 3, 1, "cannot hold"), (3, 2, 3, "between 1 and")],
)
def test_limits_refused_when_nothing_can_be_thrashed(
    osds: int, size: int, min_size: int, why: str | None
) -> None:
    if why is None:
        assert Limits.for_pools(osds, size, min_size).max_dead == 0  # only out/in: a 4th copy place
        return
    with pytest.raises(ThrashError, match=why):
        Limits.for_pools(osds, size, min_size)


def test_the_sandbox_cluster_allows_one_dead_and_one_out() -> None:
    lim = Limits.for_pools(3, 2, 1)
    v = View(frozenset({0, 1, 2}))
    moves = dict(candidates(v, lim))
    assert set(moves) == {Move.OUT, Move.KILL, Move.MARK_DOWN}
    v = after(v, Action(Move.KILL, 1, mark_out=True))
    moves = dict(candidates(v, lim))
    # One dead already (max dead 1) and two in (min in 2): only bringing osd.1 back is allowed.
    assert set(moves) == {Move.IN, Move.REVIVE} and moves[Move.REVIVE] == [1]
    assert clean_reachable(v, lim)  # down and out: Ceph re-replicates onto the other two


def test_a_dead_osd_still_in_keeps_the_cluster_from_clean() -> None:
    lim = Limits.for_pools(3, 2, 1)
    v = after(after(View(frozenset({0, 1, 2})), Action(Move.OUT, 2)), Action(Move.KILL, 0))
    assert v.dead == {0} and v.out == {2} and within(v, lim)
    assert not clean_reachable(v, lim)
    assert choose(random.Random(1), v, lim) is not None
    # A kill when only min_in OSDs are in leaves the OSD in (never marked out below min_in).
    assert choose_only(v, lim, Move.KILL) == []


def choose_only(v: View, lim: Limits, move: Move) -> list[int]:
    return dict(candidates(v, lim)).get(move, [])


def test_a_marked_down_osd_counts_as_dead_until_it_rejoins() -> None:
    lim = Limits.for_pools(3, 2, 1)
    v = after(View(frozenset({0, 1, 2})), Action(Move.MARK_DOWN, 2))
    assert v.unavailable == {2} and Move.KILL not in dict(candidates(v, lim))
    v = rejoined(v, {0, 1, 2})
    assert v.unavailable == frozenset() and Move.KILL in dict(candidates(v, lim))


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from([(3, 2, 1), (3, 3, 1), (3, 3, 2), (5, 3, 2), (6, 3, 1), (4, 2, 1)]),
    steps=st.integers(1, 60),
)
def test_no_seed_ever_breaks_the_limits(seed: int, shape: tuple[int, int, int], steps: int) -> None:
    osds, size, min_size = shape
    lim = Limits.for_pools(osds, size, min_size)
    rng = random.Random(seed)
    v = View(frozenset(range(osds)))
    for _ in range(steps):
        a = choose(rng, v, lim)
        if a is None:  # only while a marked-down OSD has not marked itself up again
            assert v.marked_down, v
            v = rejoined(v, set(range(osds)))
            continue
        v = after(v, a)
        assert within(v, lim), (a, v)
        if rng.random() < 0.5:  # marked-down OSDs come back up at some point
            v = rejoined(v, set(range(osds)))


def test_the_same_seed_makes_the_same_changes() -> None:
    lim = Limits.for_pools(3, 2, 1)

    def run(seed: int) -> list[Action]:
        rng, v, out = random.Random(seed), View(frozenset({0, 1, 2})), []
        for _ in range(30):
            a = choose(rng, v, lim)
            assert a is not None
            out.append(a)
            v = rejoined(after(v, a), {0, 1, 2})
        return out

    assert run(7) == run(7) and run(7) != run(8)
    assert {a.move for a in run(7)} >= {Move.OUT, Move.IN, Move.KILL}


def test_distribution_is_median_nearest_rank_p90_and_max() -> None:
    assert distribution([]) == {"n": 0, "median": None, "p90": None, "max": None}
    d = distribution([float(x) for x in range(1, 11)])
    assert d == {"n": 10, "median": 5.5, "p90": 9.0, "max": 10.0}
    assert distribution([3.0]) == {"n": 1, "median": 3.0, "p90": 3.0, "max": 3.0}


def test_an_error_is_accounted_only_when_it_overlaps_a_change_window() -> None:
    wins = windows([(100.0, 104.0), (200.0, None)], grace_s=15.0, until=250.0)
    assert [(w.start, w.end) for w in wins] == [(100.0, 119.0), (200.0, 265.0)]
    assert accounted(90.0, 101.0, wins)  # began before the change, failed during its peering
    assert accounted(118.0, 128.0, wins)  # began within the grace (a timeout that ran past it)
    assert not accounted(120.0, 130.0, wins)  # after the PGs were active plus the grace: unaccounted
    assert not accounted(50.0, 60.0, wins)
    assert accounted(260.0, 261.0, wins)  # a change never seen active: open until the end


def test_ledger_entries_close_when_the_thrasher_undid_all_they_stand_for() -> None:
    led = Ledgered()
    led.opened("kill", {(1, "dead"), (1, "out")})
    led.opened("out2", {(2, "out")})
    assert led.undone({(1, "dead")}) == []  # revived but still out
    assert led.undone({(1, "out"), (1, "dead")}) == ["kill"]
    assert led.undone({(2, "out")}) == ["out2"] and led.open == {}


def test_a_save_is_lost_only_when_newer_than_the_oldest_kept_and_gone() -> None:
    from gpufleet.chaos.storage.thrash import lost_saves

    events = [
        {"t": 1.0, "event": "resume", "restart": 0},
        {"t": 2.0, "event": "checkpoint", "step": 10},  # before the thrash
        {"t": 11.0, "event": "checkpoint", "step": 20},  # pruned by retention (older than the oldest kept)
        {"t": 12.0, "event": "checkpoint", "step": 30},
        {"t": 13.0, "event": "checkpoint_failed", "step": 35},
        {"t": 14.0, "event": "resume", "restart": 1},
        {"t": 15.0, "event": "checkpoint", "step": 40},  # gone: lost
        {"t": 16.0, "event": "checkpoint", "step": 50},
    ]
    have = {(0, 30), (1, 50)}
    assert lost_saves(events, have, since=10.0) == (4, ["restart 1 step 40"])
    assert lost_saves(events, {(0, 30), (1, 40), (1, 50)}, since=10.0) == (4, [])
    assert lost_saves(events, set(), since=10.0)[1] == [
        "restart 0 step 20",
        "restart 0 step 30",
        "restart 1 step 40",
        "restart 1 step 50",
    ]
