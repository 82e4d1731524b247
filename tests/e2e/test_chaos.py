"""End-to-end: experiments run for real on the sandbox with plain `chaos run`, and a runner killed
with SIGKILL mid-fault is cleaned up by `gpufleet chaos revert`.

Needs root, Slurm, Prometheus and PyTorch (the sandbox); about 6 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos.backends.sandbox_undo import agent_request
from gpufleet.chaos.ledger import Ledger
from gpufleet.core.sandbox_contract import SandboxState, read_state

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("chaos-sbx")
    e = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(root / "ledger.jsonl")}
    up = subprocess.run(
        [str(BIN / "gpufleet"), "sandbox", "up", "--stack", "sandbox"],
        env=e,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, f"sandbox up failed:\n{up.stdout}\n{up.stderr}"
        yield e
    finally:
        subprocess.run([str(BIN / "gpufleet"), "chaos", "revert"], env=e, cwd=REPO, timeout=120)
        down = subprocess.run(
            [str(BIN / "gpufleet"), "sandbox", "down", "--stack", "sandbox"],
            env=e,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert down.returncode == 0, down.stderr


def _state(env: dict[str, str]) -> SandboxState:
    return read_state("sandbox", Path(env["GPUFLEET_SANDBOX_ROOT"]))


def _wait_training(env: dict[str, str], timeout: float = 150) -> None:
    """Experiments start from a progressing job (the previous one may still be restarting)."""
    path = _state(env).training_events
    assert path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = Path(path).read_text().splitlines()[-5:]
        steps = [json.loads(x) for x in lines if '"event": "step"' in x]
        if len(steps) >= 2 and time.time() - steps[-1]["t"] < 3:
            return
        time.sleep(2)
    pytest.fail("the training job is not progressing")


def _run(env: dict[str, str], name: str, tmp: Path) -> tuple[int, dict[str, Any]]:
    _wait_training(env)
    journal = tmp / f"{name}.journal.json"
    p = subprocess.run(
        [
            str(BIN / "chaos"),
            "--log-file",
            str(tmp / f"{name}.log"),
            "run",
            "--journal-path",
            str(journal),
            str(REPO / "experiments" / f"{name}.json"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=420,
    )
    return p.returncode, json.loads(journal.read_text())


def _timeline(journal: dict[str, Any]) -> dict[str, Any]:
    last = journal["run"][-1]
    assert last["activity"]["name"] == "recovery-timeline" and last["status"] == "succeeded", last
    tl: dict[str, Any] = last["output"]
    return tl


def _kinds(tl: dict[str, Any]) -> dict[str, float]:
    t0 = min(e["at"] for e in tl["events"] if e["kind"] == "injected")
    out: dict[str, float] = {}
    for e in tl["events"]:
        out.setdefault(e["kind"], e["at"] - t0)
    return out


def _assert_clean(env: dict[str, str]) -> None:
    assert Ledger(env["GPUFLEET_LEDGER"]).pending() == []
    for n in _state(env).nodes:
        for link in n.fabric:
            assert Path(f"/sys/class/net/{link.peer}/operstate").read_text().strip() == "up", link.peer


def test_node_crash_recovers_within_budget(env: dict[str, str], tmp_path: Path) -> None:
    rc, j = _run(env, "node-crash", tmp_path)
    t = _kinds(_timeline(j))
    assert t["isolated"] <= 30 and t["resumed"] <= 60, t
    assert "returned" in t
    assert rc == 0 and j["deviated"] is False, (t, j["steady_states"]["after"])
    _assert_clean(env)


def test_fabric_link_down_recovers_within_budget(env: dict[str, str], tmp_path: Path) -> None:
    rc, j = _run(env, "fabric-link-down", tmp_path)
    tl = _timeline(j)
    t = _kinds(tl)
    assert t["detected"] <= 15 and t["resumed"] <= 60, t
    assert any(e["source"] == "prometheus:FabricPortDown" for e in tl["events"])
    assert rc == 0 and j["deviated"] is False, (t, j["steady_states"]["after"])
    _assert_clean(env)


def test_gpu_xid79_drains_the_node(env: dict[str, str], tmp_path: Path) -> None:
    rc, j = _run(env, "gpu-xid79-fallen-off-bus", tmp_path)
    tl = _timeline(j)
    t = _kinds(tl)
    assert any(e["source"] == "prometheus:GpuFallenOffBus" for e in tl["events"]), tl["events"]
    assert t["detected"] <= 15 and t["isolated"] <= 15, t
    assert rc == 0 and j["deviated"] is False, (t, j["steady_states"]["after"])
    _assert_clean(env)


def test_kill_9_mid_fault_then_revert(env: dict[str, str], tmp_path: Path) -> None:
    st = _state(env)
    node = next(n for n in st.nodes if n.role == "compute" and n.name != "gpu-0")
    peer = node.fabric[0].peer
    exp = {
        "title": "crash test",
        "description": "faults held until the runner is killed",
        "configuration": {"gpufleet_backend": "sandbox", "gpufleet_stack": "sandbox"},
        "controls": [
            {"name": "gpufleet-safety", "provider": {"type": "python", "module": "gpufleet.chaos.control"}}
        ],
        "method": [
            {
                "type": "action",
                "name": "xid",
                "provider": {
                    "type": "python",
                    "module": "gpufleet.chaos.gpu.actions",
                    "func": "inject_gpu_fault",
                    "arguments": {"fault_id": "gpu-xid-45", "node": node.name, "gpu": 1},
                },
            },
            {
                "type": "action",
                "name": "link",
                "provider": {
                    "type": "python",
                    "module": "gpufleet.chaos.fabric.actions",
                    "func": "link_down",
                    "arguments": {"node": node.name},
                },
                "pauses": {"after": 300},
            },
        ],
    }
    path = tmp_path / "hold.json"
    path.write_text(json.dumps(exp))
    runner = subprocess.Popen(
        [
            str(BIN / "chaos"),
            "--log-file",
            str(tmp_path / "hold.log"),
            "run",
            "--journal-path",
            str(tmp_path / "hold.journal.json"),
            str(path),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ledger = Ledger(env["GPUFLEET_LEDGER"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(ledger.pending()) < 2:
        time.sleep(0.5)
    time.sleep(1)
    runner.send_signal(signal.SIGKILL)
    runner.wait(timeout=10)
    assert {r.kind for r in ledger.pending()} == {"dcgm-inject", "link-down"}
    assert Path(f"/sys/class/net/{peer}/operstate").read_text().strip() == "down"
    assert node.agent_socket
    gpus = agent_request(node.agent_socket, st.agent_token_file, "GET", "/state")["gpus"]
    assert gpus[1]["xid_counts"], gpus[1]

    rev = subprocess.run(
        [str(BIN / "gpufleet"), "chaos", "revert"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rev.returncode == 0, rev.stdout + rev.stderr
    assert Path(f"/sys/class/net/{peer}/operstate").read_text().strip() == "up"
    gpus = agent_request(node.agent_socket, st.agent_token_file, "GET", "/state")["gpus"]
    assert gpus[1]["xid_counts"] == {} and gpus[1]["fault"] is None
    assert ledger.pending() == []
    again = subprocess.run(
        [str(BIN / "gpufleet"), "chaos", "revert"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "nothing to revert" in again.stdout
