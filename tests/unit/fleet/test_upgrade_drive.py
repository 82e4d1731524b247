"""The loop that runs a rollout against a backend: actions performed in order, job changes fed back
as events, timing of drained capacity. The backend here is a recording model of a small fleet; the
real one (the Slurm sandbox) is exercised by tests/e2e/test_upgrade_sandbox.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.config import UpgradeSpec
from gpufleet.fleet.upgrade import FleetSnapshot, NodeObservation, plan_upgrade
from gpufleet.fleet.upgrade.drive import drive
from gpufleet.fleet.upgrade.model import Job
from gpufleet.fleet.upgrade.rollout import Rollout

OLD, NEW, BAD = "1.0", "2.0", "2.0-bad"


@dataclass
class Fleet:
    versions: dict[str, str]
    running: dict[str, list[Job]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    drained: set[str] = field(default_factory=set)
    clock: float = 0.0
    faults: dict[str, tuple[float, str]] = field(default_factory=dict)  # node -> (from when, what)
    asked: list[list[str]] = field(default_factory=list)

    def tick(self) -> float:
        return self.clock

    def sleep(self, s: float) -> None:
        self.clock += max(s, 0.01)

    def jobs(self) -> dict[str, list[Job]]:
        return {n: list(js) for n, js in self.running.items()}

    def cordon(self, node: str, reason: str) -> None:
        self.calls.append(("cordon", node))
        self.drained.add(node)

    def evict(self, job_ids: tuple[str, ...]) -> None:
        self.calls.append(("evict", ",".join(job_ids)))
        for node in self.running:
            self.running[node] = [j for j in self.running[node] if j.id not in job_ids]

    def reboot(self, node: str, version: str, timeout_s: float) -> str | None:
        self.calls.append(("reboot", f"{node}@{version}"))
        self.clock += 3.0
        self.versions[node] = version
        return version

    def gate(self, node: str, version: str) -> tuple[bool, str]:
        self.clock += 2.0
        ok = version != BAD
        self.calls.append(("gate", f"{node}:{'ok' if ok else 'fail'}"))
        return ok, "" if ok else "driver failed to load"

    def uncordon(self, node: str) -> bool:
        self.calls.append(("uncordon", node))
        self.drained.discard(node)
        return True

    def hold(self, node: str, reason: str) -> None:
        self.calls.append(("hold", node))

    def health(self, nodes: Sequence[str]) -> dict[str, str]:
        self.asked.append(list(nodes))
        return {n: what for n, (since, what) in self.faults.items() if n in nodes and self.clock >= since}


def setup(target: str, jobs: dict[str, list[Job]] | None = None) -> tuple[Rollout, Fleet]:
    names = [f"gpu-{i}" for i in range(4)]
    fleet = Fleet({n: OLD for n in names}, dict(jobs or {}))
    snap = FleetSnapshot(source="live", nodes=[
        NodeObservation(name=n, pool="gpu", version=OLD, jobs=fleet.running.get(n, [])) for n in names])
    spec = UpgradeSpec(wave_size=1, max_unavailable=1, bake_seconds=5)
    return Rollout(plan_upgrade(snap, spec, target), snap, "t1"), fleet


def test_every_node_in_waves_of_one_evicting_the_job_first() -> None:
    job = Job(id="12", name="train", queue="batch")
    rollout, fleet = setup(NEW, {"gpu-0": [job], "gpu-1": [job]})
    run = drive(rollout, fleet, protect=lambda j: False, clock=fleet.tick, sleep=fleet.sleep)
    assert rollout.finished and rollout.halted_by is None and rollout.peak_out == 1
    assert fleet.versions == {f"gpu-{i}": NEW for i in range(4)} and not fleet.drained
    # gpu-2 is the idle canary; gpu-0 is cordoned, its job evicted, and rebooted only once it ended.
    i = fleet.calls.index(("cordon", "gpu-0"))
    assert fleet.calls[i + 1:i + 3] == [("evict", "12"), ("reboot", f"gpu-0@{NEW}")]
    assert fleet.calls[0] == ("cordon", "gpu-2")
    cap = run.capacity()
    assert cap["nodesTaken"] == 4 and cap["minimumNodeSeconds"] == 4 * 5.0
    assert cap["drainedNodeSeconds"] >= cap["minimumNodeSeconds"]


def test_a_bad_version_fails_the_canary_gate_rolls_it_back_and_touches_nothing_else() -> None:
    rollout, fleet = setup(BAD)
    run = drive(rollout, fleet, protect=lambda j: False, clock=fleet.tick, sleep=fleet.sleep)
    assert rollout.halted_by is not None and rollout.finished
    assert fleet.calls == [("cordon", "gpu-0"), ("reboot", f"gpu-0@{BAD}"), ("gate", "gpu-0:fail"),
                           ("reboot", f"gpu-0@{OLD}"), ("gate", "gpu-0:ok"), ("uncordon", "gpu-0")]
    assert set(fleet.versions.values()) == {OLD} and not fleet.drained
    assert [e["action"] for e in run.log].count("cordon") == 1


def test_a_protected_job_is_waited_for_and_its_end_fed_back() -> None:
    job = Job(id="7", name="llm-70b", queue="prod", protected=True)
    rollout, fleet = setup(NEW, {"gpu-0": [job], "gpu-1": [], "gpu-2": [], "gpu-3": []})
    steps = {"n": 0}

    def sleep(s: float) -> None:
        fleet.sleep(s)
        steps["n"] += 1
        if steps["n"] == 30:  # the protected job ends on its own
            fleet.running["gpu-0"] = []

    drive(rollout, fleet, protect=lambda j: j.queue == "prod", clock=fleet.tick, sleep=sleep)
    assert ("evict", "7") not in fleet.calls
    assert rollout.nodes["gpu-0"].phase.value == "done" and rollout.nodes["gpu-0"].waited_seconds > 0


def test_a_fault_on_a_node_not_yet_taken_is_seen_and_the_node_is_left_alone() -> None:
    rollout, fleet = setup(NEW)
    fleet.faults["gpu-2"] = (0.0, "XID 79")
    run = drive(rollout, fleet, protect=lambda j: False, clock=fleet.tick, sleep=fleet.sleep)
    assert not any(node == "gpu-2" or node.startswith("gpu-2@") for _, node in fleet.calls)
    assert rollout.nodes["gpu-2"].phase.value == "skipped" and rollout.halted_by is None
    assert {"action": "unhealthy", "node": "gpu-2"}.items() <= next(
        e for e in run.log if e["action"] == "unhealthy").items()
    # Once skipped, the node is no longer the rollout's to watch.
    i = next(i for i, asked in enumerate(fleet.asked) if "gpu-2" in asked)
    assert all("gpu-2" not in asked for asked in fleet.asked[i + 1:])


def test_a_regression_during_the_canarys_bake_halts_before_the_next_wave() -> None:
    rollout, fleet = setup(NEW)
    fleet.faults["gpu-0"] = (6.0, "XID 79")  # the canary returns at t=5; the bake lasts 5 s
    drive(rollout, fleet, protect=lambda j: False, clock=fleet.tick, sleep=fleet.sleep)
    assert rollout.halted_by is not None and "regressed" in rollout.halted_by
    assert [c for c in fleet.calls if c[0] == "cordon"] == [("cordon", "gpu-0")]


def test_a_held_node_counts_as_drained_until_the_end_of_the_run() -> None:
    rollout, fleet = setup(NEW)
    fleet.clock = 1000.0  # the loop's clock is absolute; node times are relative to its start
    fleet.faults["gpu-0"] = (0.0, "XID 79")

    def gate(node: str, version: str) -> tuple[bool, str]:
        fleet.clock += 2.0
        return False, "XID 79"  # the fault stays: the rollback's gate fails too, the node is held

    fleet.gate = gate  # type: ignore[method-assign]
    run = drive(rollout, fleet, protect=lambda j: False, clock=fleet.tick, sleep=fleet.sleep)
    assert rollout.report()["counts"] == {"failed": 1, "skipped": 3}
    cap = run.capacity()
    assert cap["drainedNodeSeconds"] == cap["wallSeconds"] < 100
