"""The loop that runs a rollout against a live backend: perform each action, feed back what is
observed (jobs starting and ending on nodes, reboots done, gate results), tick on timeouts and bakes.
The decisions stay in `rollout.Rollout`; a backend only implements `Backend`.

Every action and observation is timed, so the report says how long each node was drained (capacity
lost) against the time its reboot and gate took (the part no rollout can avoid).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.fleet.upgrade.model import Job
from gpufleet.fleet.upgrade.rollout import (
    Action,
    Cordon,
    Event,
    Evict,
    GateResult,
    Hold,
    JobEnded,
    JobStarted,
    NodeUnhealthy,
    Reboot,
    RebootDone,
    Rollout,
    RunGate,
    Tick,
    Uncordon,
)


class Backend(Protocol):
    def jobs(self) -> dict[str, list[Job]]: ...
    def cordon(self, node: str, reason: str) -> None: ...
    def evict(self, job_ids: tuple[str, ...]) -> None: ...
    def reboot(self, node: str, version: str, timeout_s: float) -> str | None: ...
    def gate(self, node: str, version: str) -> tuple[bool, str]: ...
    def uncordon(self, node: str) -> bool: ...
    def hold(self, node: str, reason: str) -> None: ...
    def health(self, nodes: Sequence[str]) -> dict[str, str]: ...  # node -> fault, unhealthy ones only


@dataclass
class NodeTimes:
    cordoned_at: float | None = None
    returned_at: float | None = None  # uncordoned, or held (then still out at the end)
    upgrade_seconds: float = 0.0  # reboots and gates: the part of being out no rollout avoids


@dataclass
class Run:
    rollout: Rollout
    started_at: float
    ended_at: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, NodeTimes] = field(default_factory=dict)

    def capacity(self) -> dict[str, Any]:
        """Node-seconds drained by the rollout against the minimum (the reboots and gates alone)."""
        end = self.ended_at - self.started_at  # node times are relative to the start, like this
        drained = sum((t.returned_at if t.returned_at is not None else end) - t.cordoned_at
                      for t in self.times.values() if t.cordoned_at is not None)
        minimum = sum(t.upgrade_seconds for t in self.times.values())
        return {
            "nodesTaken": sum(1 for t in self.times.values() if t.cordoned_at is not None),
            "drainedNodeSeconds": round(drained, 2),
            "minimumNodeSeconds": round(minimum, 2),
            "ratio": round(drained / minimum, 3) if minimum > 0 else None,
            "wallSeconds": round(self.ended_at - self.started_at, 2),
        }

    def to_doc(self) -> dict[str, Any]:
        return {**self.rollout.report(), "capacity": self.capacity(), "log": self.log}


def reboot_durations(log: list[dict[str, Any]]) -> list[float]:
    """Each reboot's seconds, `reboot` to `rebooted`, in a run's timed log (Run.log, the report's)."""
    out, started = [], {}
    for e in log:
        if e["action"] == "reboot":
            started[e["node"]] = e["t"]
        elif e["action"] == "rebooted" and e["node"] in started:
            out.append(round(e["t"] - started.pop(e["node"]), 2))
    return out


def _job_events(at: float, known: dict[str, dict[str, Job]], now: dict[str, list[Job]],
                nodes: set[str]) -> list[Event]:
    """JobStarted / JobEnded for every change between what the rollout knows and what runs now."""
    events: list[Event] = []
    for node in sorted(nodes):
        before = known.setdefault(node, {})
        current = {j.id: j for j in now.get(node, [])}
        for jid in sorted(set(before) - set(current)):
            events.append(JobEnded(at, node, jid))
            del before[jid]
        for jid in sorted(set(current) - set(before)):
            events.append(JobStarted(at, node, current[jid]))
            before[jid] = current[jid]
    return events


def drive(
    rollout: Rollout,
    backend: Backend,
    *,
    protect: Callable[[Job], bool],
    say: Callable[[str], None] = lambda _m: None,
    poll_seconds: float = 0.25,  # how late a drained node is seen empty: part of the capacity lost
    health_seconds: float = 1.0,  # how often the nodes the rollout watches are read for faults
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Run:
    """Run the rollout to its end on the backend. KeyboardInterrupt propagates (the backend's cordon
    record says which nodes are still out)."""
    t0 = clock()
    run = Run(rollout, t0)

    def now() -> float:
        return clock() - t0

    known: dict[str, dict[str, Job]] = {
        name: {jid: Job(id=jid, protected=p) for jid, p in n.jobs.items()}
        for name, n in rollout.nodes.items()
    }
    wave_of = {name: n.wave for name, n in rollout.nodes.items()}

    def note(what: str, node: str, **extra: Any) -> None:
        entry = {"t": round(now(), 2), "action": what, "node": node, **extra}
        run.log.append(entry)
        wave = wave_of.get(node)
        label = "canary" if wave == 0 else f"wave {wave}"
        say(f"[{entry['t']:7.1f} s] {label:>8} {node}: {what}"
            + "".join(f" {k}={v}" for k, v in extra.items()))

    def perform(action: Action) -> list[Event]:
        times = run.times.setdefault(action.node, NodeTimes())
        if isinstance(action, Cordon):
            note("cordon", action.node)
            backend.cordon(action.node, action.reason)
            times.cordoned_at = now()
        elif isinstance(action, Evict):
            note("evict", action.node, jobs=",".join(action.jobs))
            backend.evict(action.jobs)
        elif isinstance(action, Reboot):
            note("reboot", action.node, version=action.version)
            began = now()
            version = backend.reboot(action.node, action.version, rollout.policy.reboot_timeout_seconds)
            times.upgrade_seconds += now() - began
            note("rebooted", action.node, reports=version)
            return [RebootDone(now(), action.node, version)] if version is not None else []
        elif isinstance(action, RunGate):
            began = now()
            passed, detail = backend.gate(action.node, action.version)
            times.upgrade_seconds += now() - began
            note("gate " + ("passed" if passed else "FAILED"), action.node, detail=detail)
            return [GateResult(now(), action.node, passed, detail)]
        elif isinstance(action, Uncordon):
            returned = backend.uncordon(action.node)
            times.returned_at = now()
            note("uncordon" if returned else "left drained (reason changed by someone else)", action.node)
        elif isinstance(action, Hold):
            note("hold", action.node, reason=action.reason)
            backend.hold(action.node, action.reason)
        return []

    pending = list(rollout.start(now()))
    health_due = 0.0
    while True:
        while pending:
            for event in perform(pending.pop(0)):
                pending += rollout.handle(event)
        if rollout.finished:
            break
        jobs = {node: [j.model_copy(update={"protected": protect(j)}) for j in js]
                for node, js in backend.jobs().items()}
        for event in _job_events(now(), known, jobs, set(rollout.nodes)):
            pending += rollout.handle(event)
        if now() >= health_due and not rollout.finished:
            health_due = now() + health_seconds
            for node, what in sorted(backend.health(rollout.watched()).items()):
                note("unhealthy", node, detail=what)
                pending += rollout.handle(NodeUnhealthy(now(), node, what))
        if not pending:
            wake = rollout.next_wakeup()
            sleep(poll_seconds if wake is None else max(0.0, min(poll_seconds, wake - now())))
            pending += rollout.handle(Tick(now()))
    run.ended_at = clock()
    return run
