"""The fault ledger: every fault is written here, durably, BEFORE it is applied.

Where it lives (`LedgerStore`): a JSON-lines file (one object per line, appended with O_APPEND,
fsync'd file and directory; `FileStore`), or, for a runner whose files die with it (the game-day
CronJob's pod), a ConfigMap of the cluster it injects into (`configmap://<namespace>/<name>`,
gpufleet.chaos.backends.kube_ledger). Either way a runner killed with `kill -9` mid-fault leaves a
record of exactly what it did and how to undo it. `gpufleet chaos revert` (and the experiment
control, and the signal handlers) replay the named rollback of every entry that has no successful
`reverted` line, newest first.

Records:
  {"op": "apply", "id", "run_id", "at", "kind", "backend", "stack", "target", "params",
   "rollback": {"name", "args"}, "dry_run", "pid"}
  {"op": "reverted", "id", "at", "ok", "error"}
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpufleet.core.ledger_location import CONFIGMAP_SCHEME

logger = logging.getLogger("chaostoolkit")

# One lock for appends from the method, background flappers and signal handlers. Re-entrant: a
# signal handler runs on the main thread between bytecodes and may append while the main thread
# holds it (a plain Lock would deadlock there).
_APPEND_LOCK = threading.RLock()


@dataclass(frozen=True)
class Rollback:
    name: str  # key in gpufleet.chaos.rollbacks.ROLLBACKS
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultRecord:
    kind: str  # catalog injection method, e.g. "dcgm-inject", "link-down"
    backend: str
    target: dict[str, Any]  # e.g. {"node": "gpu-1", "gpu": 0}
    rollback: Rollback
    params: dict[str, Any] = field(default_factory=dict)
    stack: str | None = None
    fault_id: str | None = None
    run_id: str | None = None
    dry_run: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    at: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["op"] = "apply"
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> FaultRecord:
        rb = d["rollback"]
        return FaultRecord(
            kind=d["kind"],
            backend=d["backend"],
            target=dict(d.get("target") or {}),
            rollback=Rollback(rb["name"], dict(rb.get("args") or {})),
            params=dict(d.get("params") or {}),
            stack=d.get("stack"),
            fault_id=d.get("fault_id"),
            run_id=d.get("run_id"),
            dry_run=bool(d.get("dry_run", False)),
            id=d["id"],
            at=float(d["at"]),
            pid=int(d.get("pid", 0)),
        )


@dataclass(frozen=True)
class Reverted:
    id: str
    at: float
    ok: bool
    error: str | None = None


@dataclass(frozen=True)
class RevertResult:
    record: FaultRecord
    ok: bool
    error: str | None


class LedgerStore(Protocol):
    """Where ledger objects are appended and read back, in the order they were appended."""

    @property
    def where(self) -> str: ...

    def append(self, obj: dict[str, Any]) -> None: ...

    def objects(self) -> Iterator[dict[str, Any]]: ...


class FileStore:
    """A JSON-lines file on this machine."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @property
    def where(self) -> str:
        return str(self.path)

    def append(self, obj: dict[str, Any]) -> None:
        line = (json.dumps(obj, sort_keys=True, default=str) + "\n").encode()
        new_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)  # one write(2) of one line: never interleaved with another
            os.fsync(fd)
        finally:
            os.close(fd)
        if new_dir or os.path.getsize(self.path) == len(line):
            # A new file's directory entry must be durable too (fsync(2): "Calling fsync()
            # does not necessarily ensure that the entry in the directory ... has reached disk").
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def objects(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for n, raw in enumerate(fh, 1):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    # A torn last line (power loss mid-append) is the only way to get here.
                    logger.warning("ledger %s line %d is unreadable; skipped", self.path, n)
                    continue
                if isinstance(obj, dict):
                    yield obj


class Ledger:
    def __init__(self, store: LedgerStore | Path | str) -> None:
        if isinstance(store, str) and store.startswith(CONFIGMAP_SCHEME):
            # Needs a connection to the cluster: gpufleet.chaos.engine.open_ledger builds that store.
            raise ValueError(f"ledger {store}: a ConfigMap ledger is opened with its cluster connection")
        self.store: LedgerStore = FileStore(store) if isinstance(store, Path | str) else store

    @property
    def where(self) -> str:
        return self.store.where

    # ---------------------------------------------------------------- writing
    def _append(self, obj: dict[str, Any]) -> None:
        with _APPEND_LOCK:
            self.store.append(obj)

    def record(self, rec: FaultRecord) -> FaultRecord:
        """Write the fault BEFORE it is applied; returns the record."""
        self._append(rec.to_json())
        return rec

    def mark_reverted(self, rec_id: str, ok: bool = True, error: str | None = None) -> None:
        self._append({"op": "reverted", "id": rec_id, "at": time.time(), "ok": ok, "error": error})

    # ---------------------------------------------------------------- reading
    def _lines(self) -> Iterator[dict[str, Any]]:
        return self.store.objects()

    def records(self) -> list[FaultRecord]:
        return [FaultRecord.from_json(o) for o in self._lines() if o.get("op") == "apply"]

    def reverts(self) -> list[Reverted]:
        return [
            Reverted(o["id"], float(o["at"]), bool(o["ok"]), o.get("error"))
            for o in self._lines()
            if o.get("op") == "reverted"
        ]

    def pending(self, run_id: str | None = None) -> list[FaultRecord]:
        """Applied (not dry-run) faults with no successful revert, oldest first."""
        done = {r.id for r in self.reverts() if r.ok}
        return [
            r
            for r in self.records()
            if r.id not in done and not r.dry_run and (run_id is None or r.run_id == run_id)
        ]

    def reverted_at(self, rec_id: str) -> float | None:
        hits = [r.at for r in self.reverts() if r.id == rec_id and r.ok]
        return min(hits) if hits else None


RollbackFn = Callable[[dict[str, Any]], None]


def revert_pending(
    ledger: Ledger,
    rollbacks: dict[str, RollbackFn],
    run_id: str | None = None,
    only: set[str] | None = None,
) -> list[RevertResult]:
    """Undo every pending fault, newest first. A failing rollback is recorded and the others still
    run; its entry stays pending so the next revert retries it. Idempotent: reverted entries are
    skipped, and every rollback tolerates a fault that is already gone."""
    out = []
    for rec in reversed(ledger.pending(run_id)):
        if only is not None and rec.id not in only:
            continue
        fn = rollbacks.get(rec.rollback.name)
        if fn is None:
            err = f"unknown rollback {rec.rollback.name!r} (ledger written by a newer gpufleet?)"
            ledger.mark_reverted(rec.id, ok=False, error=err)
            out.append(RevertResult(rec, False, err))
            continue
        try:
            fn(rec.rollback.args)
        except Exception as e:  # every rollback must get its chance; report, do not stop
            err = f"{type(e).__name__}: {e}"
            logger.error("rollback %s of fault %s failed: %s", rec.rollback.name, rec.id, err)
            ledger.mark_reverted(rec.id, ok=False, error=err)
            out.append(RevertResult(rec, False, err))
            continue
        ledger.mark_reverted(rec.id, ok=True)
        out.append(RevertResult(rec, True, None))
    return out
