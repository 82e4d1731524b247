"""The OSD thrasher's decisions, as pure functions: its limits, the next action, when the cluster
can be clean, the time-to-clean distribution and which S3 errors a change accounts for.

The thrasher follows Ceph's own (qa/tasks/ceph_manager.py, the OSD `Thrasher` of the teuthology
suite): OSDs are marked out, killed (then marked down, and out when the in-count allows), marked in
and revived at random, weighted as Ceph weighs them (out 1.0, kill 1.0, in 1.7, revive 1.0), with a
pause between actions. Unlike Ceph's, whose `max_dead` is only enforced at its clean intervals, the
limits here hold after every action, because they are what keeps data available:

- max dead = pool size - min_size: a placement group serves I/O while min_size of its size copies
  are up (Ceph "Pools": min_size); with all OSDs on one host any two OSDs may hold copies of the same
  PG, so more than size - min_size OSDs down stops some PG (the same bound as guard.osd_blast_radius).
  A live OSD marked down counts as dead until it has marked itself up again.
- min in = pool size: CRUSH needs `size` OSDs in to place every copy; with fewer, PGs stay
  undersized and the cluster can never be clean again until an OSD comes back in.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace
from enum import StrEnum


class ThrashError(ValueError):
    """Limits that cannot be met by this cluster (said with the numbers)."""


class Move(StrEnum):
    OUT = "out"  # `ceph osd out N` of a live, in OSD
    KILL = "kill"  # SIGKILL, `ceph osd down N`, and `ceph osd out N` when min_in allows
    MARK_DOWN = "down"  # `ceph osd down N` of a live OSD: it says "wrongly marked me down" and rejoins
    IN = "in"  # `ceph osd in N` (a dead OSD is revived first, as Ceph's in_osd does)
    REVIVE = "revive"  # start the daemon again from its Launch recipe


# Ceph's thrasher weights (choose_action): out_osd 1.0, kill_osd chance_down (1.0 here), in_osd 1.7,
# revive_osd 1.0. Marking a live OSD down is Ceph's mark_down_osd, used here on its own at half weight.
WEIGHTS: dict[Move, float] = {
    Move.OUT: 1.0,
    Move.KILL: 1.0,
    Move.IN: 1.7,
    Move.REVIVE: 1.0,
    Move.MARK_DOWN: 0.5,
}


@dataclass(frozen=True)
class Limits:
    max_dead: int
    min_in: int
    pool_size: int

    @staticmethod
    def for_pools(osds: int, pool_size: int, pool_min_size: int) -> Limits:
        """The limits derived from the pools' size and min_size (module docstring); refused when they
        leave nothing to thrash or the cluster cannot hold them."""
        if not 1 <= pool_min_size <= pool_size:
            raise ThrashError(f"pool min_size {pool_min_size} must be between 1 and size {pool_size}")
        if osds < pool_size:
            raise ThrashError(f"{osds} OSD(s) cannot hold pools of size {pool_size}")
        max_dead = pool_size - pool_min_size
        if max_dead == 0 and osds == pool_size:
            raise ThrashError(
                f"pools of size {pool_size} and min_size {pool_min_size} on {osds} OSDs: no OSD may go "
                "down (max dead 0) and none may go out (min in = size): nothing to thrash"
            )
        return Limits(max_dead=max_dead, min_in=pool_size, pool_size=pool_size)


@dataclass(frozen=True)
class View:
    """What the thrasher knows of the OSDs: all of them, the dead (killed or marked down by it) and
    the out ones."""

    osds: frozenset[int]
    dead: frozenset[int] = frozenset()
    out: frozenset[int] = frozenset()
    marked_down: frozenset[int] = field(default=frozenset())  # live OSDs marked down, not yet up again

    @property
    def live(self) -> frozenset[int]:
        return self.osds - self.dead

    @property
    def inn(self) -> frozenset[int]:
        return self.osds - self.out

    @property
    def unavailable(self) -> frozenset[int]:
        return self.dead | self.marked_down


@dataclass(frozen=True)
class Action:
    move: Move
    osd: int
    mark_out: bool = False  # KILL only: also marked out (min_in allows it)


def candidates(view: View, limits: Limits) -> list[tuple[Move, list[int]]]:
    """Every move allowed now with the OSDs it may target; each leaves the limits holding."""
    out: list[tuple[Move, list[int]]] = []
    in_live = sorted(view.inn - view.unavailable)
    if len(view.inn) > limits.min_in and in_live:
        out.append((Move.OUT, in_live))
    up = sorted(view.live - view.marked_down)
    if len(view.unavailable) < limits.max_dead and up:
        out.append((Move.KILL, up))
        out.append((Move.MARK_DOWN, up))
    if view.out:
        out.append((Move.IN, sorted(view.out)))
    if view.dead:
        out.append((Move.REVIVE, sorted(view.dead)))
    return out


def choose(rng: random.Random, view: View, limits: Limits) -> Action | None:
    """The next action, drawn with Ceph's weights among the allowed ones (None: nothing allowed)."""
    allowed = candidates(view, limits)
    if not allowed:
        return None
    total = sum(WEIGHTS[m] for m, _ in allowed)
    x = rng.uniform(0, total)
    move, osds = allowed[-1]
    for m, targets in allowed:
        if x < WEIGHTS[m]:
            move, osds = m, targets
            break
        x -= WEIGHTS[m]
    osd = rng.choice(osds)
    mark_out = move is Move.KILL and osd in view.inn and len(view.inn) > limits.min_in
    return Action(move, osd, mark_out)


def after(view: View, action: Action) -> View:
    """The view once `action` is done (a marked-down OSD still counts as unavailable until the
    thrasher sees it up again: `rejoined`)."""
    o = action.osd
    if action.move is Move.OUT:
        return replace(view, out=view.out | {o})
    if action.move is Move.KILL:
        return replace(
            view,
            dead=view.dead | {o},
            marked_down=view.marked_down - {o},
            out=view.out | {o} if action.mark_out else view.out,
        )
    if action.move is Move.MARK_DOWN:
        return replace(view, marked_down=view.marked_down | {o})
    if action.move is Move.IN:
        return replace(view, out=view.out - {o}, dead=view.dead - {o})
    return replace(view, dead=view.dead - {o})


def rejoined(view: View, up: set[int]) -> View:
    """Marked-down OSDs that Ceph reports up again are available again."""
    return replace(view, marked_down=view.marked_down - up)


def within(view: View, limits: Limits) -> bool:
    return len(view.unavailable) <= limits.max_dead and len(view.inn) >= limits.min_in


def clean_reachable(view: View, limits: Limits) -> bool:
    """Can every PG become active+clean in this state? Not while a dead OSD is still in (its copies
    stay degraded until it is revived or marked out), nor with fewer than `size` OSDs up and in."""
    up_in = view.inn - view.dead
    return not (view.dead & view.inn) and len(up_in) >= limits.pool_size


def distribution(values: list[float]) -> dict[str, float | int | None]:
    """n, median, p90 (nearest rank) and max of `values`; None figures for no values."""
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None}
    xs = sorted(values)
    rank = max(1, -(-9 * len(xs) // 10))  # nearest-rank percentile: ceil(0.9 n)
    return {
        "n": len(xs),
        "median": round(statistics.median(xs), 2),
        "p90": round(xs[rank - 1], 2),
        "max": round(xs[-1], 2),
    }


@dataclass(frozen=True)
class Window:
    """From a change to every PG active again, plus a grace: while it lasts, PGs may be peering or
    inactive and an S3 request to one of them may block past the client's timeout or fail."""

    start: float
    end: float


def windows(changes: list[tuple[float, float | None]], grace_s: float, until: float) -> list[Window]:
    """One window per change (applied at, all PGs active at or None: not seen before `until`)."""
    return [Window(at, (active if active is not None else until) + grace_s) for at, active in changes]


def accounted(started: float, ended: float, wins: list[Window]) -> bool:
    """An S3 request that failed is accounted for when it overlapped a change's window."""
    return any(started <= w.end and ended >= w.start for w in wins)
