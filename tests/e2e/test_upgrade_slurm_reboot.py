"""End-to-end: `gpufleet upgrade run --driver slurm` on the real Slurm sandbox: every node's upgrade
is a real `scontrol reboot ASAP nextstate=DOWN` that slurmctld sees complete (ADR 0064).

Slurm's own view is read by the test, apart from the driver: a watcher polls sinfo during the
rollout (state and reason of every node), and `scontrol show node` gives each node's BootTime
before and after. A bad version: the canary boots into it, Slurm holds it DOWN with the rollout's
reason, its gate fails, it is rebooted back and only then returned; no other node is touched. A
good version: every node boots again (BootTime later than before), its agent reports the version,
and it is schedulable again only after its gate passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import REPO, gpufleet, wait_until

from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo
from gpufleet.fleet.upgrade.slurm_driver import parse_show_node

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
pytestmark = [pytest.mark.sandbox, needs_root, pytest.mark.timeout(1800)]

STACK = "sandbox"
OLD, NEW, BAD = "550.90.07", "570.124.06", "560.0.0-bad"
NODES = [f"gpu-{i}" for i in range(5)]
# The stack's timeouts (60 s) fit an idle machine; this one is shared and its load average reached
# 100-200 while these tests ran, when a cancelled job took 76 s to complete on its nodes (slurmctld:
# "completion process took 76 seconds"). The rollout runs with more room, so that a node skipped
# for a slow drain does not hide what is tested here: the reboot path.
ROOMY = {"drainTimeoutSeconds": 600, "rebootTimeoutSeconds": 300, "gateTimeoutSeconds": 300}


def roomy_stack(tmp: Path) -> Path:
    text = (REPO / "stacks" / f"Pulumi.{STACK}.yaml").read_text()
    for key, value in ROOMY.items():
        lines = [ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:")]
        assert len(lines) == 1, key
        indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
        text = text.replace(lines[0], f"{indent}{key}: {value}")
    out = tmp / f"Pulumi.{STACK}.yaml"
    out.write_text(text)
    return out


class Box:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state: SandboxState = read_state(STACK, root)
        self.token = Path(self.state.agent_token_file or "").read_text().strip()

    def sinfo(self) -> dict[str, NodeObs]:
        res = subprocess.run(self.state.slurm_command(*SINFO_ARGS), capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 0, res.stderr
        return parse_sinfo(res.stdout)

    def boot_times(self) -> dict[str, float]:
        out = {}
        for n in NODES:
            res = subprocess.run(self.state.slurm_command("scontrol", "-o", "show", "node", n),
                                 capture_output=True, text=True, timeout=30)
            boot = parse_show_node(res.stdout).boot_time
            assert boot is not None, res.stdout + res.stderr
            out[n] = boot
        return out

    def versions(self) -> dict[str, Any]:
        self.state = read_state(STACK, self.root)
        out = {}
        for n in self.state.nodes:
            if n.name in NODES and n.agent_socket:
                with httpx.Client(transport=httpx.HTTPTransport(uds=n.agent_socket), base_url="http://a",
                                  headers={"Authorization": f"Bearer {self.token}"}, timeout=5) as c:
                    out[n.name] = c.get("/state").json()["driver_version"]
        return out


class Watcher(threading.Thread):
    """Every node's (state, reason) as sinfo shows them, each change with its wall time."""

    def __init__(self, box: Box) -> None:
        super().__init__(daemon=True)
        self.box, self.stop_at = box, False
        self.seen: dict[str, list[tuple[float, str, str, bool]]] = {n: [] for n in NODES}

    def run(self) -> None:
        while not self.stop_at:
            try:
                obs = self.box.sinfo()
            except (AssertionError, subprocess.TimeoutExpired):
                continue
            now = time.time()
            for n, o in obs.items():
                if n in self.seen:
                    entry = (now, o.state, o.reason, o.schedulable)
                    if not self.seen[n] or self.seen[n][-1][1:] != entry[1:]:
                        self.seen[n].append(entry)
            time.sleep(0.2)

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        # The rollout has returned; the watcher's last poll may predate its last resume, so it
        # watches on until every node's latest state is schedulable (bounded).
        end = time.monotonic() + 30
        while time.monotonic() < end and not all(s and s[-1][3] for s in self.seen.values()):
            time.sleep(0.2)
        self.stop_at = True
        self.join(timeout=60)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    root = tmp_path_factory.mktemp("slurm-reboot-root")
    res = gpufleet(root, "sandbox", "up", "--stack", STACK, timeout=600)
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        yield Box(root)
    finally:
        gpufleet(root, "sandbox", "down", "--stack", STACK, "--keep-files", timeout=300)


def _run(box: Box, version: str, report: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    stack = roomy_stack(report.parent)
    res = gpufleet(box.root, "upgrade", "run", "--stack", str(stack), "--driver", "slurm", "--to", version,
                   "--report", str(report), timeout=1500)
    print(res.stdout)
    return res, json.loads(report.read_text())


def test_a_bad_version_is_held_down_by_slurm_then_rolled_back(box: Box, tmp_path: Path) -> None:
    assert set(box.versions().values()) == {OLD}
    before = box.boot_times()
    with Watcher(box) as w:
        res, doc = _run(box, BAD, tmp_path / "bad.json")
    assert res.returncode == 1, res.stdout + res.stderr
    assert doc["driver"] == "slurm" and doc["nextState"] == "DOWN"
    cordoned = [e["node"] for e in doc["log"] if e["action"] == "cordon"]
    assert len(cordoned) == 1, cordoned
    canary = cordoned[0]
    reboots = doc["slurmReboots"]
    assert [r["version"] for r in reboots] == [BAD, OLD] and {r["node"] for r in reboots} == {canary}
    assert all(r["outcome"] == "done" for r in reboots), reboots
    # Slurm held the canary DOWN at the bad version with the rollout's reason (not schedulable)...
    assert reboots[0]["states"][-1] == "DOWN" and reboots[0]["reason"].endswith("reboot complete")
    seen = w.seen[canary]
    first_out = next(i for i, s in enumerate(seen) if not s[3])
    back = [i for i, s in enumerate(seen) if s[3] and i > first_out]
    assert back, seen
    # ... and it was schedulable again only after its second (rollback) boot.
    down_reasons = [s[2] for s in seen[first_out:back[0]]]
    assert sum(1 for r in down_reasons if r.endswith("reboot complete")) >= 1, seen
    after = box.boot_times()
    assert after[canary] > before[canary] + 1
    # slurmd recomputes the boot time (now - uptime, whole seconds) at each registration: +-1 s.
    for n in NODES:
        if n != canary:
            assert abs(after[n] - before[n]) <= 1, (n, before[n], after[n])
            assert not any(s[2].startswith("gpufleet-upgrade") for s in w.seen[n]), (n, w.seen[n])
    assert set(box.versions().values()) == {OLD}
    wait_until("every node schedulable", lambda: all(o.schedulable for o in box.sinfo().values()), 60)


def test_every_node_reboots_through_slurm_and_returns_only_after_its_gate(box: Box, tmp_path: Path) -> None:
    before = box.boot_times()
    t0 = time.time()
    with Watcher(box) as w:
        res, doc = _run(box, NEW, tmp_path / "good.json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert doc["haltedBy"] is None and doc["counts"] == {"done": 5}
    assert box.versions() == dict.fromkeys(NODES, NEW)
    after = box.boot_times()
    for n in NODES:
        assert after[n] >= t0 - 1 and after[n] > before[n] + 1, (n, before[n], after[n])
    for r in doc["slurmReboots"]:
        assert r["outcome"] == "done" and r["states"][-1] == "DOWN", r
        assert r["bootTimeAfter"] >= int(r["requestedAt"]), r
    # Per node: once out, the node came back schedulable only after Slurm showed its boot complete
    # (DOWN, "... : reboot complete"), i.e. Slurm did not return it: the rollout did after the gate.
    for n in NODES:
        seen = w.seen[n]
        out = [i for i, s in enumerate(seen) if not s[3]]
        assert out, (n, seen)
        back = [i for i, s in enumerate(seen) if s[3] and i > out[0]]
        assert back, (n, seen)
        assert any(s[2].endswith("reboot complete") for s in seen[out[0]:back[0]]), (n, seen)
    log = doc["log"]
    for n in NODES:
        acts = [e["action"] for e in log if e["node"] == n]
        assert acts.index("gate passed") < acts.index("uncordon"), (n, acts)
    secs = [r["seconds"] for r in doc["slurmReboots"]]
    print(f"reboot seconds per node: {secs}; capacity {doc['capacity']}")
