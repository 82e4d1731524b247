"""The OSD thrasher on the storage sandbox's real Ceph cluster (docs/storage.md, ADR 0066).

For a bounded time and at most a bounded number of changes, OSDs are marked out, killed, marked
down, marked in and revived at random (seeded; decisions in thrash_policy) within limits derived
from the pools' size and min_size, while the storage sandbox's checkpoint writer saves and an S3
oracle (oracle.S3Oracle) writes objects and checks every read by sha256. Every change goes to the
fault ledger before it is applied (kind `osd-thrash`, rollback `storage.thrash-revert`: every OSD
started and marked in), and is closed in the ledger once the thrasher itself undid it. After each
change it waits until every PG is active and, where the new state allows it, active+clean: the
time to clean of each change is one sample of the reported distribution.

An S3 error (the oracle's or a failed checkpoint save) is accounted for when it overlapped a
change's window: from the change until every PG was seen active again, plus the client's timeout
(thrash_policy.windows). Anything else is unaccounted and fails the run, as does any read that
differs from its write, any checkpoint lost or corrupt, a change after which some PG stayed
inactive, or a cluster not clean at the end.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from chaoslib.exceptions import ActivityFailed

from gpufleet.chaos import engine
from gpufleet.chaos.backends.base import Plan
from gpufleet.chaos.backends.storage import StorageBackend
from gpufleet.chaos.backends.storage_undo import rb_restart_daemon
from gpufleet.chaos.ledger import Rollback
from gpufleet.chaos.storage.oracle import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, S3Oracle
from gpufleet.chaos.storage.thrash_policy import (
    Action,
    Limits,
    Move,
    View,
    Window,
    accounted,
    after,
    choose,
    clean_reachable,
    distribution,
    rejoined,
    windows,
    within,
)
from gpufleet.core.ceph_admin import CephCommandError, ceph_json, ceph_run, pg_counts
from gpufleet.core.checkpoint_manifest import stem
from gpufleet.core.fs_checkpoints import checkpoint_store_of
from gpufleet.core.jsonl import append_objects, read_objects
from gpufleet.core.procs import alive
from gpufleet.core.storage_contract import StorageSandboxState, read_storage_state

logger = logging.getLogger("chaostoolkit")

KIND = "osd-thrash"
ROLLBACK = "storage.thrash-revert"
EVENTS = "osd-thrash"  # the storage sandbox's events file holding each run's report
POLL_S = 1.0
REVIVE_UP_S = 120.0  # a revived OSD must be up within this (Ceph's thrasher waits up to 360 s)
# A failed checkpoint save is logged when the writer gives up on it: its requests began at most its
# store's attempts (2) times connect plus read timeouts (5 + 10 s) earlier (core.s3_checkpoints).
WRITER_FAILURE_SPAN_S = 2 * (5.0 + 10.0)


@dataclass(frozen=True)
class ThrashSettings:
    minutes: float = 2.0
    max_changes: int = 20
    seed: int | None = None
    min_pause_s: float = 1.0
    max_pause_s: float = 5.0  # Ceph's thrasher pauses op_delay (5 s) between actions
    settle_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.minutes <= 60:
            raise ActivityFailed(f"minutes must be in (0, 60], not {self.minutes}")
        if not 1 <= self.max_changes <= 500:
            raise ActivityFailed(f"max_changes must be in [1, 500], not {self.max_changes}")
        if not 0 <= self.min_pause_s <= self.max_pause_s:
            raise ActivityFailed("min_pause_seconds must be >= 0 and <= max_pause_seconds")


@dataclass
class Change:
    n: int
    move: str
    osd: int
    marked_out: bool
    ledger_id: str
    at: float
    clean_reachable: bool
    active_at: float | None = None
    clean_at: float | None = None
    health_ok_at: float | None = None
    error: str | None = None

    def seconds(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.at, 2)


@dataclass
class Ledgered:
    """The ledger entries still open and what each stands for: (osd, aspect) pairs, aspect dead,
    out or down; an entry is closed (reverted) once the thrasher undid all of it."""

    open: dict[str, set[tuple[int, str]]] = field(default_factory=dict)

    def opened(self, rec_id: str, aspects: set[tuple[int, str]]) -> None:
        if aspects:
            self.open[rec_id] = set(aspects)

    def undone(self, aspects: set[tuple[int, str]]) -> list[str]:
        done = []
        for rec_id, left in list(self.open.items()):
            left -= aspects
            if not left:
                done.append(rec_id)
                del self.open[rec_id]
        return done


def _osd_states(state: StorageSandboxState) -> dict[int, tuple[bool, bool]]:
    """osd -> (up, in), from `ceph osd dump`."""
    doc = ceph_json(state, "osd", "dump", timeout_s=30)
    return {int(o["osd"]): (bool(o["up"]), bool(o["in"])) for o in doc.get("osds", [])}


def _pg_summary(state: StorageSandboxState) -> tuple[bool, bool, bool, dict[str, int]]:
    """(every PG active, every PG active+clean, HEALTH_OK, PG count by state)."""
    pgs = pg_counts(ceph_json(state, "pg", "stat", timeout_s=30))
    health = ceph_json(state, "health", timeout_s=30).get("status")
    return pgs.all_active, pgs.all_clean, health == "HEALTH_OK", pgs.by_state


class Thrasher:
    def __init__(self, configuration: dict[str, Any], settings: ThrashSettings) -> None:
        self.configuration = configuration
        self.settings = settings
        self.ctx = engine.context(configuration)
        backend = self.ctx.backend()
        if not isinstance(backend, StorageBackend):
            raise ActivityFailed(
                "the OSD thrasher runs on the storage backend: set gpufleet_backend to storage"
            )
        self.backend = backend
        self.stack = backend.stack
        self.state_root = backend.state_root
        state = self.state
        self.osds = sorted(o.id for o in state.osds)
        self.limits = Limits.for_pools(len(self.osds), state.pool_size or 1, state.pool_min_size or 1)
        self.seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "big")
        self.rng = random.Random(self.seed)
        self.view = View(frozenset(self.osds))
        self.ledgered = Ledgered()
        self.changes: list[Change] = []
        self.problems: list[str] = []

    @property
    def state(self) -> StorageSandboxState:
        # Read again each time: a revive records the new process in the state file.
        return read_storage_state(self.stack, self.state_root)

    # ------------------------------------------------------------ ledger + apply
    def _rollback(self) -> Rollback:
        state = self.state
        osds = {f"ceph-osd.{o}": state.process(f"ceph-osd.{o}").launch.model_dump() for o in self.osds}
        return Rollback(
            ROLLBACK,
            {
                "stack": self.stack,
                "state_root": str(self.state_root) if self.state_root else None,
                "osds": osds,
            },
        )

    def _kill(self, osd: int) -> dict[str, Any]:
        p = self.state.process(f"ceph-osd.{osd}")
        if not alive(p.pid, p.start_time):
            raise ActivityFailed(f"osd.{osd} (pid {p.pid}) is not running: nothing to kill")
        os.kill(p.pid, signal.SIGKILL)
        return {"pid": p.pid}

    def _revive(self, osd: int) -> None:
        p = self.state.process(f"ceph-osd.{osd}")
        rb_restart_daemon(
            {
                "stack": self.stack,
                "state_root": str(self.state_root) if self.state_root else None,
                "name": p.name,
                "launch": p.launch.model_dump(),
            }
        )
        deadline = time.monotonic() + REVIVE_UP_S
        while time.monotonic() < deadline:
            if _osd_states(self.state).get(osd, (False, False))[0]:
                return
            time.sleep(POLL_S)
        raise ActivityFailed(f"osd.{osd} was started again but not up within {REVIVE_UP_S:g} s")

    def _apply(self, action: Action) -> dict[str, Any]:
        o, state = action.osd, self.state
        out: dict[str, Any] = {"move": action.move.value, "osd": o}
        try:
            if action.move is Move.OUT:
                ceph_run(state, "osd", "out", str(o))
            elif action.move is Move.KILL:
                out.update(self._kill(o))
                # As Ceph's thrasher (kill_osd mark_down): peering starts now, not after the grace.
                ceph_run(state, "osd", "down", str(o))
                if action.mark_out:
                    ceph_run(state, "osd", "out", str(o))
            elif action.move is Move.MARK_DOWN:
                ceph_run(state, "osd", "down", str(o))
            elif action.move is Move.IN:
                if o in self.view.dead:
                    self._revive(o)
                ceph_run(state, "osd", "in", str(o))
            else:
                self._revive(o)
        except CephCommandError as e:
            raise ActivityFailed(str(e)) from None
        return out

    def _aspects(self, action: Action) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
        """(what the action opens, what it undoes) as (osd, aspect) pairs."""
        o = action.osd
        if action.move is Move.OUT:
            return {(o, "out")}, set()
        if action.move is Move.KILL:
            return {(o, "dead")} | ({(o, "out")} if action.mark_out else set()), {(o, "down")}
        if action.move is Move.MARK_DOWN:
            return {(o, "down")}, set()
        if action.move is Move.IN:
            return set(), {(o, "out"), (o, "dead")}
        return set(), {(o, "dead")}

    def step(self, action: Action) -> Change:
        n = len(self.changes) + 1
        summary = {
            Move.OUT: f"mark osd.{action.osd} out",
            Move.KILL: f"kill osd.{action.osd} (SIGKILL), mark it down"
            + (" and out" if action.mark_out else ""),
            Move.MARK_DOWN: f"mark osd.{action.osd} down (it is running: it marks itself up again)",
            Move.IN: f"mark osd.{action.osd} in"
            + (" (revived first)" if action.osd in self.view.dead else ""),
            Move.REVIVE: f"revive osd.{action.osd} from its Launch recipe",
        }[action.move]
        plan = Plan(
            kind=KIND,
            target={"osd": action.osd},
            params={"move": action.move.value, "change": n, "mark_out": action.mark_out, "seed": self.seed},
            rollback=self._rollback(),
            apply=lambda: self._apply(action),
            summary=f"thrash change {n}: {summary}",
        )
        next_view = after(self.view, action)
        if not within(next_view, self.limits):  # the policy never proposes this; a last check
            raise ActivityFailed(f"change {n} ({summary}) would break the limits {self.limits}")
        res = engine.execute(self.ctx, self.backend, plan)
        rec_id = str(res["id"])
        opens, undoes = self._aspects(action)
        self.ledgered.opened(rec_id, opens)
        closed = self.ledgered.undone(undoes)
        if not opens:
            closed.append(rec_id)  # a revive or in undoes; it leaves nothing to roll back
        for done in closed:
            self.ctx.ledger.mark_reverted(done, ok=True)
        self.view = next_view
        change = Change(
            n,
            action.move.value,
            action.osd,
            action.mark_out,
            rec_id,
            float(res["at"]),
            clean_reachable(next_view, self.limits),
        )
        self.changes.append(change)
        self._settle(change)
        return change

    def refresh_marked_down(self) -> None:
        """Marked-down OSDs that Ceph reports up again count as available again; their ledger
        entries are closed."""
        up = {o for o, (is_up, _) in _osd_states(self.state).items() if is_up}
        if self.view.marked_down & up:
            for rec_id in self.ledgered.undone({(o, "down") for o in self.view.marked_down & up}):
                self.ctx.ledger.mark_reverted(rec_id, ok=True)
        self.view = rejoined(self.view, up)

    def _settle(self, change: Change) -> None:
        """Wait until every PG is active, and active+clean where this state allows it (bounded)."""
        deadline = time.monotonic() + self.settings.settle_timeout_s
        by_state: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                active, clean, ok, by_state = _pg_summary(self.state)
                if self.view.marked_down:
                    self.refresh_marked_down()
                    change.clean_reachable = clean_reachable(self.view, self.limits)
            except CephCommandError as e:
                logger.warning("thrash: ceph did not answer (%s)", e)
                time.sleep(POLL_S)
                continue
            now = time.time()
            if active and change.active_at is None:
                change.active_at = now
            if clean and change.clean_at is None:
                change.clean_at = now
            if ok and change.health_ok_at is None:
                change.health_ok_at = now
            if change.active_at is not None and (change.clean_at is not None or not change.clean_reachable):
                return
            time.sleep(POLL_S)
        what = "active+clean" if change.active_at is not None else "active"
        # The states last seen say why (a CI run's change stayed unclean for 120 s at HEALTH_OK, and
        # nothing kept them).
        last = ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "no answer"
        change.error = f"not every PG {what} within {self.settings.settle_timeout_s:g} s (last seen: {last})"
        self.problems.append(f"change {change.n} ({change.move} osd.{change.osd}): {change.error}")

    def restore_all(self) -> Change | None:
        """Every dead OSD revived and every out OSD marked in, each a change of its own (Ceph's
        thrasher ends with all_up_in); the time to clean of the last is the final one."""
        last = None
        deadline = time.monotonic() + self.settings.settle_timeout_s
        while self.view.marked_down and time.monotonic() < deadline:
            try:
                self.refresh_marked_down()
            except CephCommandError as e:
                logger.warning("thrash: ceph did not answer (%s)", e)
            time.sleep(POLL_S)
        for o in sorted(self.view.dead - self.view.out):
            last = self.step(Action(Move.REVIVE, o))
        for o in sorted(self.view.out):
            last = self.step(Action(Move.IN, o))
        return last


def _writer_failures(state: StorageSandboxState, since: float) -> list[dict[str, Any]]:
    events = read_objects(state.events_file("checkpoint-writer"))
    return [
        e
        for e in events
        if float(e.get("t", 0)) >= since and e.get("event") in ("checkpoint_failed", "resume_failed")
    ]


def lost_saves(
    events: list[dict[str, Any]], have: set[tuple[int, int]], since: float
) -> tuple[int, list[str]]:
    """(saves since `since`, those lost): a checkpoint the writer said it saved (its events, each save
    numbered by the restart of the resume before it) that the store no longer lists although it is
    newer than the oldest one listed (older ones went by the writer's retention)."""
    restart, saved = -1, []
    for e in events:
        if e.get("event") == "resume":
            restart = int(e["restart"])
        elif e.get("event") == "checkpoint" and float(e["t"]) >= since:
            saved.append((restart, int(e["step"])))
    oldest = min(have, default=None)
    lost = [(r, s) for r, s in saved if (oldest is None or (r, s) > oldest) and (r, s) not in have]
    return len(saved), [f"restart {r} step {s}" for r, s in lost]


def _checkpoints(state: StorageSandboxState, since: float) -> dict[str, Any]:
    """Every complete checkpoint verified by sha256, and every checkpoint the writer said it saved
    since `since` found, unless older than the oldest it keeps (retention, not loss)."""
    store = checkpoint_store_of(state)
    # The writer's events first, then the listing: every save read here happened before the listing,
    # so it is listed unless the writer's retention pruned it (then it is older than the oldest kept).
    events = read_objects(state.events_file("checkpoint-writer"))
    complete = store.complete()
    corrupt = []
    verified = 0
    for m in complete:
        problems = store.verify(m)
        if problems and store.manifest((m.job, m.restart, m.step)) is None:
            continue  # pruned by the writer while being checked
        if problems:
            corrupt.append({"checkpoint": stem((m.job, m.restart, m.step)), "problems": problems})
        else:
            verified += 1
    saved, lost = lost_saves(events, {(m.restart, m.step) for m in complete}, since)
    return {
        "complete": len(complete),
        "verified": verified,
        "corrupt": corrupt,
        "saved_during": saved,
        "lost": lost,
    }


def thrash(configuration: dict[str, Any], settings: ThrashSettings) -> dict[str, Any]:
    """Run the thrasher; returns its report (also appended to the sandbox's `osd-thrash` events)."""
    t = Thrasher(configuration, settings)
    state = t.state
    if state.checkpoint_bucket is None:
        raise ActivityFailed(f"the storage sandbox of {state.stack} has no checkpoint bucket")
    # Ceph's thrasher starts from a clean cluster (wait_for_clean); so does this one.
    deadline = time.monotonic() + settings.settle_timeout_s
    while True:
        try:
            _active, clean, _, _ = _pg_summary(state)
            osd_states = _osd_states(state)
        except CephCommandError as e:
            raise ActivityFailed(str(e)) from None
        if clean and all(u and i for u, i in osd_states.values()):
            break
        if time.monotonic() > deadline:
            raise ActivityFailed(
                f"the cluster is not clean with every OSD up and in: {osd_states}; "
                "the thrasher starts from a clean cluster"
            )
        time.sleep(POLL_S)
    started = time.time()
    oracle = S3Oracle(state, state.checkpoint_bucket, f"oracle/{t.ctx.run.run_id}/", seed=t.seed)
    oracle.start()
    stop_at = time.monotonic() + settings.minutes * 60
    try:
        while time.monotonic() < stop_at and len(t.changes) < settings.max_changes:
            action = choose(t.rng, t.view, t.limits)
            if action is not None:
                t.step(action)
            elif t.view.marked_down:  # nothing allowed until a marked-down OSD is up again
                try:
                    t.refresh_marked_down()
                except CephCommandError as e:
                    logger.warning("thrash: ceph did not answer (%s)", e)
            time.sleep(t.rng.uniform(settings.min_pause_s, settings.max_pause_s))
        thrashed = len(t.changes)
    finally:
        final = t.restore_all()
        oracle.stop()
    ended = time.time()
    if t.ledgered.open:
        t.problems.append(f"ledger entries still open after the thrash: {sorted(t.ledgered.open)}")
    if final is not None and final.clean_at is None:
        t.problems.append("the cluster was not clean after every OSD came back up and in")
    oracle.verify_all()
    try:
        oracle.delete_all()
    except Exception as e:  # the report matters more than the oracle's leftovers; say so
        t.problems.append(f"oracle objects not deleted: {type(e).__name__}: {e}")
    wins = windows([(c.at, c.active_at) for c in t.changes], READ_TIMEOUT_S + CONNECT_TIMEOUT_S, ended)
    report = _report(t, oracle, wins, started, ended, thrashed, settings)
    append_objects(state.events_file(EVENTS), [report])
    return report


def _report(
    t: Thrasher,
    oracle: S3Oracle,
    wins: list[Window],
    started: float,
    ended: float,
    thrashed: int,
    settings: ThrashSettings,
) -> dict[str, Any]:
    state = t.state
    oracle_unaccounted = [asdict(e) for e in oracle.tally.errors if not accounted(e.started, e.ended, wins)]
    writer = _writer_failures(state, started)
    writer_unaccounted = [
        e for e in writer if not accounted(float(e["t"]) - WRITER_FAILURE_SPAN_S, float(e["t"]), wins)
    ]
    ckpt = _checkpoints(state, started)
    clean_s = [s for c in t.changes if c.clean_reachable and (s := c.seconds(c.clean_at)) is not None]
    active_s = [s for c in t.changes if (s := c.seconds(c.active_at)) is not None]
    tally = oracle.tally.to_doc()
    problems = list(t.problems)
    if tally["mismatches"]:
        problems.append(f"{len(tally['mismatches'])} oracle read(s) differed from what was written")
    if tally["unrecovered"]:
        problems.append(f"{len(tally['unrecovered'])} oracle request(s) never succeeded")
    if oracle_unaccounted or writer_unaccounted:
        problems.append(
            f"S3 errors unaccounted for: {len(oracle_unaccounted)} of the oracle, "
            f"{len(writer_unaccounted)} of the checkpoint writer"
        )
    if ckpt["corrupt"] or ckpt["lost"]:
        problems.append(f"checkpoints corrupt {len(ckpt['corrupt'])}, lost {len(ckpt['lost'])}")
    return {
        "t": ended,
        "event": "thrash",
        "run_id": t.ctx.run.run_id,
        "stack": t.stack,
        "outcome": "FAIL" if problems else "PASS",
        "problems": problems,
        "seed": t.seed,
        "limits": {
            "max_dead": t.limits.max_dead,
            "min_in": t.limits.min_in,
            "pool_size": t.limits.pool_size,
            "osds": len(t.osds),
            "why": "max dead = size - min_size (min_size copies of every PG stay up); "
            "min in = size (CRUSH can place every copy)",
        },
        "settings": asdict(settings),
        "started_at": started,
        "seconds": round(ended - started, 1),
        "changes": len(t.changes),
        "thrash_changes": thrashed,
        "moves": {m.value: sum(1 for c in t.changes if c.move == m.value) for m in Move},
        "time_to_clean_s": distribution(clean_s),
        "time_to_active_s": distribution(active_s),
        "not_clean_reachable": sum(1 for c in t.changes if not c.clean_reachable),
        "oracle": {
            **tally,
            "accounted": len(oracle.tally.errors) - len(oracle_unaccounted),
            "unaccounted": oracle_unaccounted[:20],
        },
        "writer_failures": {"total": len(writer), "unaccounted": writer_unaccounted[:20]},
        "checkpoints": ckpt,
        "timeline": [
            {
                "n": c.n,
                "move": c.move,
                "osd": c.osd,
                "marked_out": c.marked_out,
                "ledger": c.ledger_id,
                "at": round(c.at - started, 2),
                "clean_reachable": c.clean_reachable,
                "to_active_s": c.seconds(c.active_at),
                "to_clean_s": c.seconds(c.clean_at),
                "to_health_ok_s": c.seconds(c.health_ok_at),
                "error": c.error,
            }
            for c in t.changes
        ],
    }


def latest_report(state: StorageSandboxState, run_id: str) -> dict[str, Any] | None:
    reports = [e for e in read_objects(state.events_file(EVENTS)) if e.get("run_id") == run_id]
    return reports[-1] if reports else None
