"""End-to-end: `gpufleet upgrade run` on the real Slurm sandbox, in a state root of its own.

A bad version stops at the canary (rolled back, every other node untouched); then every node is
upgraded in waves of one under the running training job: every agent reports the new version, no
node is left drained, training keeps making steps and no checkpoint is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import GPUFLEET, REPO, gpufleet, wait_until

from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo
from gpufleet.fleet.upgrade.sandbox_driver import CordonRecord, record_path

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
pytestmark = [pytest.mark.sandbox, needs_root, pytest.mark.timeout(1200)]

STACK = "sandbox"
OLD, NEW, BAD = "550.90.07", "570.124.06", "560.0.0-bad"


class Box:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state: SandboxState = read_state(STACK, root)
        self.token = Path(self.state.agent_token_file or "").read_text().strip()

    def nodes(self) -> dict[str, NodeObs]:
        argv = self.state.slurm_command(*SINFO_ARGS)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        assert res.returncode == 0, res.stderr
        return parse_sinfo(res.stdout)

    def unavailable(self) -> dict[str, str]:
        """Nodes Slurm would not schedule on, with their state and reason."""
        return {n: f"{o.state} {o.reason!r}" for n, o in self.nodes().items() if not o.schedulable}

    def settled(self) -> None:
        """No node drained now, and every node schedulable within 20 s: a restarted slurmd shows
        not responding (`idle*`) for up to one ping of slurmctld after it registered."""
        drained = {n: f"{o.state} {o.reason!r}" for n, o in self.nodes().items()
                   if "drain" in o.state.lower() or o.base_state.startswith("down")}
        assert drained == {}
        wait_until("every node schedulable", lambda: self.unavailable() == {}, 20)

    def versions(self) -> dict[str, Any]:
        out = {}
        for n in self.state.nodes:
            if n.role not in ("compute", "spare") or n.agent_socket is None:
                continue
            with httpx.Client(transport=httpx.HTTPTransport(uds=n.agent_socket), base_url="http://a",
                              headers={"Authorization": f"Bearer {self.token}"}, timeout=5) as c:
                out[n.name] = c.get("/state").json()["driver_version"]
        return out

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in Path(self.state.training_events or "").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def max_step(self) -> int:
        return max((e["step"] for e in self.events() if e.get("event") == "step"), default=-1)


def lost_checkpoints(events: list[dict[str, Any]]) -> int:
    """Resumes that started from an older checkpoint than the newest one written before them."""
    newest, lost = -1, 0
    for e in events:
        if e.get("event") == "checkpoint":
            newest = max(newest, int(e["step"]))
        elif e.get("event") == "resume" and int(e["step"]) < newest:
            lost += 1
    return lost


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    root = tmp_path_factory.mktemp("upgrade-root")
    res = gpufleet(root, "sandbox", "up", "--stack", STACK, timeout=400)
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        b = Box(root)
        wait_until("training makes steps", lambda: b.max_step() >= 5, 120)
        yield b
    finally:
        gpufleet(root, "sandbox", "down", "--stack", STACK, "--keep-files", timeout=180)


def test_a_bad_version_stops_at_the_canary_and_is_rolled_back(box: Box, tmp_path: Path) -> None:
    assert set(box.versions().values()) == {OLD}
    dry = gpufleet(box.root, "upgrade", "run", "--stack", STACK, "--to", NEW, "--dry-run")
    assert dry.returncode == 0 and "canary" in dry.stdout, dry.stdout + dry.stderr
    assert box.unavailable() == {} and CordonRecord.load(record_path(STACK, box.root)).nodes == {}
    report = tmp_path / "bad.json"
    res = gpufleet(box.root, "upgrade", "run", "--stack", STACK, "--to", BAD, "--report", str(report),
                   timeout=400)
    print(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(report.read_text())
    assert doc["haltedBy"] and BAD in json.dumps(doc)
    cordoned = [e["node"] for e in doc["log"] if e["action"] == "cordon"]
    assert len(cordoned) == 1, cordoned  # the canary alone
    assert doc["counts"].get("failed") == 1 and doc["counts"].get("done", 0) == 0
    # Rolled back, returned; every other node untouched.
    assert set(box.versions().values()) == {OLD}
    box.state = read_state(STACK, box.root)
    box.settled()


def test_every_node_upgraded_in_waves_of_one_under_training(box: Box, tmp_path: Path) -> None:
    report = tmp_path / "good.json"
    t0 = time.time()
    res = gpufleet(box.root, "upgrade", "run", "--stack", STACK, "--to", NEW, "--report", str(report),
                   timeout=900)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(report.read_text())
    assert doc["haltedBy"] is None and doc["counts"] == {"done": 5}
    assert doc["peakUnavailable"] == 1
    # Each node's gate ended with the one-step training smoke run on it (ADR 0067).
    gates = {e["node"]: e["detail"] for e in doc["log"] if e["action"] == "gate passed"}
    assert sorted(gates) == [f"gpu-{i}" for i in range(5)]
    assert all("smoke run ok: 1 rank(s), step 1 loss" in d and "checkpoint verified" in d
               for d in gates.values()), gates
    assert "smoke run" in doc["gateNote"]
    box.state = read_state(STACK, box.root)
    assert box.versions() == {f"gpu-{i}": NEW for i in range(5)}
    box.settled()
    step = box.max_step()
    wait_until("training steps advance after the rollout", lambda: box.max_step() > step + 5, 180)
    events = [e for e in box.events() if e.get("t", t0) >= t0 - 60]
    assert lost_checkpoints(box.events()) == 0
    cap = doc["capacity"]
    print(f"capacity: {cap}; resumes during the rollout: "
          f"{sum(1 for e in events if e.get('event') == 'resume')}")


def test_an_interrupted_run_leaves_its_cordons_on_record_and_cleanup_returns_them(box: Box) -> None:
    rec = record_path(STACK, box.root)
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(box.root)}
    proc = subprocess.Popen([GPUFLEET, "upgrade", "run", "--stack", STACK, "--to", "580.0.1"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        on_record = wait_until("a node on the cordon record", lambda: CordonRecord.load(rec).open_nodes(),
                               120, 0.05)
        time.sleep(1.0)  # inside the drain or the reboot
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(out)
    assert proc.returncode == 1 and "interrupted" in out, out
    assert CordonRecord.load(rec).open_nodes() == on_record
    refused = gpufleet(box.root, "upgrade", "run", "--stack", STACK, "--to", "580.0.1")
    assert refused.returncode == 2 and "--resume-cleanup" in refused.stdout + refused.stderr
    res = gpufleet(box.root, "upgrade", "run", "--stack", STACK, "--resume-cleanup")
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert CordonRecord.load(rec).open_nodes() == []
    box.state = read_state(STACK, box.root)
    assert set(box.versions().values()) <= {NEW, "580.0.1"}
    box.settled()
