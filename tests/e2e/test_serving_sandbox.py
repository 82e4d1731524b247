"""End to end: the sandbox-serving stack brings up its serving pool (a replica per node, outside
Slurm) behind HAProxy in the head namespace; a fatal XID injected through the node agent takes a
replica out of the rotation, a crash of its node's processes too, and `down` leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import GPUFLEET, REPO, gpufleet, wait_until

from gpufleet.core.haproxy_stats import server_states
from gpufleet.core.netns import run_in
from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.sandbox.agents import AgentClient

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root"),
    pytest.mark.timeout(600),
]
STACK = "sandbox-serving"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SandboxState]]:
    root = tmp_path_factory.mktemp("servingroot")
    res = gpufleet(root, "sandbox", "up", "--stack", STACK)
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        yield root, read_state(STACK, root)
    finally:
        # --keep-files: the replicas' and HAProxy's logs stay for a failed test to be read.
        down = gpufleet(root, "sandbox", "down", "--stack", STACK, "--keep-files")
        assert down.returncode == 0, down.stderr


def infer(st: SandboxState) -> tuple[int, str]:
    def post() -> tuple[int, str]:
        req = urllib.request.Request(f"{st.serving_url}/v1/infer", data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return int(r.status), str(r.headers.get("X-Replica"))
        except urllib.error.HTTPError as e:
            return int(e.code), str(e.headers.get("X-Replica"))

    assert st.head_netns is not None
    return run_in(st.head_netns, post)


def run_experiment(root: Path, tmp_path: Path, name: str) -> dict[str, Any]:
    """`chaos run` of experiments/serving/<name>.json against this module's sandbox; its journal."""
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(root / "ledger.jsonl")}
    journal_path = tmp_path / f"{name}.journal.json"
    p = subprocess.run(
        [str(Path(GPUFLEET).parent / "chaos"), "--log-file", str(tmp_path / f"{name}.log"), "run",
         "--journal-path", str(journal_path), str(REPO / "experiments" / "serving" / f"{name}.json")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    journal: dict[str, Any] = json.loads(journal_path.read_text())
    log = (tmp_path / f"{name}.log").read_text()
    assert journal["status"] == "completed", (p.stdout[-3000:], log[-5000:])
    return journal


def test_serving_pool_is_up_behind_haproxy_and_outside_slurm(state: tuple[Path, SandboxState]) -> None:
    _, st = state
    assert st.serving_url == "http://10.76.0.1:8080" and st.head_netns is not None
    assert [n.name for n in st.nodes if n.role == "serving"] == ["srv-0", "srv-1"]
    assert server_states(st.serving_stats_url or "", st.head_netns) == {"srv-0": "UP", "srv-1": "UP"}
    served = {infer(st) for _ in range(6)}
    assert served == {(200, "srv-0"), (200, "srv-1")}  # round robin over both replicas
    sinfo = subprocess.run(
        st.slurm_command("sinfo", "-h", "-N", "-o", "%N"),
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    assert "gpu-0" in sinfo and "srv-" not in sinfo
    names = {p.name for p in st.processes}
    assert {"replica@srv-0", "replica@srv-1", "haproxy", "agent@srv-0"} <= names
    assert not any(n.startswith("slurmd") and n.endswith("srv-0") for n in names), names


# First of the fault tests: the direct injection below leaves GpuFallenOffBus{srv-0} firing for a
# while after it clears, and the experiment's control refuses a cluster with a critical alert firing.
def test_a_fatal_xid_under_load_is_judged_on_requests(
    state: tuple[Path, SandboxState], tmp_path: Path
) -> None:
    """`chaos run` of experiments/serving/serving-gpu-xid79.json: Locust loads the balancer from the
    head namespace, XID 79 hits srv-0, the balancer's check takes it out (the timeline's isolation),
    and the one judge adds the request-level checks to the verdict."""
    root, st = state
    journal = run_experiment(root, tmp_path, "serving-gpu-xid79")
    verdict = journal["steady_states"]["after"]["probes"][0]["output"]
    checks = {c["name"]: c for c in verdict["checks"]}
    # The request-level checks sit beside detect / isolate in the one verdict.
    assert {"serving-availability", "serving-window-availability", "serving-window-p99-ms",
            "serving-recover-s", "detect", "isolate"} <= set(checks), sorted(checks)
    serving = verdict["serving"]
    figures = serving["figures"]
    seconds = serving["seconds"]
    # 20 users x 2/s for 45 s: about 1,800 requests were due; the dead GPU failed some of them, all
    # inside the fault window, and the rest of the run lost none.
    assert 1200 <= figures["due"] <= 2000, figures
    assert 0 < figures["failed"] == figures["window_failed"], figures
    fault_start, fault_end = serving["fault"]
    failing = [s for s in seconds if s["due"] > s["ok"]]
    assert failing and all(fault_start - 1 <= s["t"] < fault_end for s in failing), (fault_start, failing)
    assert figures["recover_seconds"] is not None and figures["recover_seconds"] < 5, figures
    assert verdict["outcome"] in ("PASS", "FAIL")  # judged, not UNKNOWN: every figure was measurable
    assert all(c["outcome"] != "UNKNOWN" for c in verdict["checks"]), verdict["checks"]
    # the isolation the timeline saw is the balancer taking srv-0 out
    timeline = next(a["output"] for a in journal["run"] if a["activity"]["name"] == "wait-for-isolation")
    isolated = [e for e in timeline["events"] if e["kind"] == "isolated"]
    assert isolated and isolated[0]["node"] == "srv-0", timeline["events"]
    # nothing outlives the run: no fault pending, no Locust left, both replicas back in the rotation
    from gpufleet.chaos.ledger import Ledger

    assert Ledger(str(root / "ledger.jsonl")).pending() == []
    assert subprocess.run(["pgrep", "-f", "gpufleet/chaos/serving/locustfile.py"]).returncode == 1
    assert server_states(st.serving_stats_url or "", st.head_netns) == {"srv-0": "UP", "srv-1": "UP"}


def test_a_gpu_hang_without_an_xid_is_seen_by_readiness_alone(
    state: tuple[Path, SandboxState], tmp_path: Path
) -> None:
    """experiments/serving/serving-gpu-hang.json: nothing the GPU reports changes, the replica's
    engine watchdog fails its readiness, the balancer takes it out and retries its 503s elsewhere."""
    root, st = state
    journal = run_experiment(root, tmp_path, "serving-gpu-hang")
    verdict = journal["steady_states"]["after"]["probes"][0]["output"]
    assert verdict["outcome"] == "PASS", (verdict["checks"], verdict["serving"]["errors"])
    timeline = next(a["output"] for a in journal["run"] if a["activity"]["name"] == "wait-for-isolation")
    isolated = [e for e in timeline["events"] if e["kind"] == "isolated"]
    assert isolated and isolated[0]["node"] == "srv-0", timeline["events"]
    assert "balancer" in isolated[0]["detail"], isolated[0]  # out of the rotation: no scheduler saw it
    assert verdict["serving"]["figures"]["window_failed"] <= 1, verdict["serving"]["figures"]
    assert server_states(st.serving_stats_url or "", st.head_netns) == {"srv-0": "UP", "srv-1": "UP"}


def test_a_rolling_restart_of_every_replica_fails_no_request(
    state: tuple[Path, SandboxState], tmp_path: Path
) -> None:
    """experiments/serving/serving-rolling-restart.json: each replica drained, restarted (a new
    process), ready and back, one at a time, under load: not one request fails."""
    root, st = state
    before = {p.name: p.pid for p in read_state(STACK, root).processes if p.name.startswith("replica@")}
    journal = run_experiment(root, tmp_path, "serving-rolling-restart")
    verdict = journal["steady_states"]["after"]["probes"][0]["output"]
    assert verdict["outcome"] == "PASS", verdict["checks"]
    assert verdict["serving"]["figures"]["failed"] == 0, verdict["serving"]["figures"]
    restarted = next(a["output"] for a in journal["run"] if a["activity"]["name"] == "rolling-restart")
    assert [r["replica"] for r in restarted["restarted"]] == ["srv-0", "srv-1"], restarted
    after = {p.name: p.pid for p in read_state(STACK, root).processes if p.name.startswith("replica@")}
    assert set(after) == set(before) and all(after[k] != before[k] for k in before), (before, after)
    from gpufleet.chaos.ledger import Ledger

    assert Ledger(str(root / "ledger.jsonl")).pending() == []
    assert server_states(st.serving_stats_url or "", st.head_netns) == {"srv-0": "UP", "srv-1": "UP"}


def test_a_fatal_xid_on_a_serving_gpu_leaves_the_rotation(state: tuple[Path, SandboxState]) -> None:
    _, st = state
    node = st.node("srv-0")
    assert node.agent_socket is not None and st.agent_token_file is not None
    agent = AgentClient(node.agent_socket, Path(st.agent_token_file).read_text().strip())
    try:
        agent.inject({"gpu": 0, "field_id": 230, "value": 79, "kmsg": True})
        out = wait_until(
            "srv-0 DOWN in HAProxy",
            lambda: server_states(st.serving_stats_url or "", st.head_netns).get("srv-0") == "DOWN",
            10,
            0.1,
        )
        assert out
        assert {infer(st) for _ in range(4)} == {(200, "srv-1")}
        health = json.loads((Path(st.base_dir) / "nodes" / "srv-0" / "gpu-health.json").read_text())
        assert health["gpus"]["0"]["fatal"] is True
    finally:
        agent.clear()
        agent.close()
    wait_until(
        "srv-0 UP again",
        lambda: server_states(st.serving_stats_url or "", st.head_netns).get("srv-0") == "UP",
        15,
        0.2,
    )
