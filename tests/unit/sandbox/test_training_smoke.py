"""The upgrade gate's one-step training smoke run (gpufleet.sandbox.training.smoke): its verdict rule,
the task environment it gives the ranks, and real one-rank PyTorch runs over gloo on lo against a
node's gpu-health.json: healthy (passes, scratch removed), a fatal GPU fault (fails with the CUDA
error), a hung GPU (fails at the deadline), and bad input (exit 2)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.core.training_events import TrainingEvent
from gpufleet.sandbox.training import smoke
from gpufleet.sandbox.training.slurmenv import rank_info


def ev(event: str, rank: int = 0, step: int | None = None, **kw: object) -> TrainingEvent:
    return TrainingEvent.model_validate({"t": 1.0, "event": event, "step": step, "restart": 0, "job_id": 0,
                                         "node": "gpu-3", "rank": rank, **kw})


GOOD = [ev("start"), ev("step", step=1, loss=0.75), ev("checkpoint", step=1), ev("exit", step=1)]


def test_a_finished_step_and_a_verified_checkpoint_pass() -> None:
    v = smoke.judge_smoke([0], GOOD, (1, ""), 25)
    assert v.passed and "step 1 loss 0.75" in v.detail and "checkpoint verified" in v.detail


@pytest.mark.parametrize(("exits", "events", "ckpt", "why"), [
    ([None], GOOD[:1], (None, ""), "rank 0 did not finish within 25 s"),
    ([0, 1], [*GOOD, ev("error", rank=1, message="RuntimeError: CUDA error: uncorrectable ECC error")],
     (1, ""), "rank 1 exited 1: RuntimeError: CUDA error: uncorrectable ECC error"),
    ([0], [ev("start")], (None, ""), "rank 0 logged no step 1"),
    ([0], [ev("step", step=1, loss=math.nan)], (1, ""), "step 1's loss is nan"),
    ([0], GOOD, (None, "0-0-1: incomplete: no manifest"), "no valid checkpoint of step 1 (0-0-1: incomplete"),
])
def test_each_missing_part_fails_and_says_which(exits: list[int | None], events: list[TrainingEvent],
                                                ckpt: tuple[int | None, str], why: str) -> None:
    v = smoke.judge_smoke(exits, events, ckpt, 25)
    assert not v.passed
    assert why in v.detail


def test_a_rank_that_failed_or_hung_is_the_whole_reason() -> None:
    v = smoke.judge_smoke([None], [ev("start")], (None, ""), 20)
    assert v.detail == ("smoke run failed: rank 0 did not finish within 20 s "
                        "(a hung GPU never completes a step)")


def test_the_task_environment_is_what_rank_info_reads_as_a_one_node_step() -> None:
    info = rank_info(smoke.task_env("gpu-3", 1, 2, 4))
    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)
    assert (info.node, info.nodes) == ("gpu-3", ("gpu-3",))
    assert info.gpus == (0, 1, 2, 3)  # every rank holds every GPU of the node, as the job's ranks do
    assert info.job_id == smoke.JOB_ID and info.restart == 0


def test_its_rendezvous_port_is_outside_the_jobs() -> None:
    from gpufleet.sandbox.training.train import rendezvous_port

    job_ports = {rendezvous_port(29500, r) for r in range(200)}
    assert smoke.RENDEZVOUS_PORT not in job_ports


# ------------------------------------------------------------------ real runs (PyTorch over gloo on lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    (tmp_path / "nodes" / "gpu-3").mkdir(parents=True)
    lo = {"mgmt_ip": "127.0.0.1", "fabric_ip": "127.0.0.1", "fabric_ifname": "lo"}
    (tmp_path / "hosts.json").write_text(json.dumps({"gpu-3": lo}))
    return tmp_path


def run_cli(base: Path, deadline: float = 60.0) -> tuple[int, dict[str, object], float]:
    t = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--node", "gpu-3", "--gpus", "2",
         "--base-dir", str(base), "--hosts-file", str(base / "hosts.json"), "--deadline", str(deadline),
         "--rendezvous-port", str(free_port())],
        capture_output=True, text=True, timeout=deadline + 30, check=False)
    doc = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {"stderr": res.stderr}
    return res.returncode, doc, time.monotonic() - t


def test_a_healthy_node_passes_and_leaves_nothing_behind(node: Path) -> None:
    rc, doc, _ = run_cli(node)
    assert rc == 0 and doc["passed"] is True, doc
    assert "checkpoint verified" in str(doc["detail"])
    node_dir = node / "nodes" / "gpu-3"
    assert not list(node_dir.glob("smoke-*"))  # scratch removed
    assert not (node_dir / "procs").exists() or not list((node_dir / "procs").iterdir())  # GPUs released


def test_a_fatal_gpu_fault_fails_it_with_the_gpus_error(node: Path) -> None:
    health = {"gpus": {"1": {"fatal": True, "error": "CUDA error: an illegal memory access (GPU 1)"}}}
    (node / "nodes" / "gpu-3" / "gpu-health.json").write_text(json.dumps(health))
    rc, doc, _ = run_cli(node)
    assert rc == 1 and doc["passed"] is False
    assert "rank 0 exited 1" in str(doc["detail"]) and "illegal memory access (GPU 1)" in str(doc["detail"])
    assert "logs in" in str(doc["detail"])  # a failure keeps its scratch folder for the engineer


def test_a_hung_gpu_fails_it_at_the_deadline(node: Path) -> None:
    hung = {"gpus": {"0": {"hung_since": 1.0}}}
    (node / "nodes" / "gpu-3" / "gpu-health.json").write_text(json.dumps(hung))
    rc, doc, took = run_cli(node, deadline=8.0)
    assert rc == 1 and "rank 0 did not finish within 8 s" in str(doc["detail"])
    assert took < 8.0 + smoke.STOP_GRACE_S + 10  # bounded: the rank is stopped, not waited for


def test_bad_input_exits_2_naming_it(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--node", "gpu-9", "--gpus", "0",
         "--base-dir", str(tmp_path), "--hosts-file", str(tmp_path / "nope.json")],
        capture_output=True, text=True, check=False)
    assert res.returncode == 2 and res.stdout == ""
    assert "--gpus 0 must be at least 1" in res.stderr
    assert f"{tmp_path / 'nodes' / 'gpu-9'}: no such node folder" in res.stderr
    assert f"{tmp_path / 'nope.json'}: no hosts file" in res.stderr


# ------------------------------------------------------------------ --standalone (the Kubernetes smoke pod)


def run_standalone(tmp_path: Path, deadline: float) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("torch")
    term = tmp_path / "termination-log"
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--standalone", "--node", "kubelet-0",
         "--gpus", "8", "--ranks", "2", "--deadline", str(deadline), "--rendezvous-port", str(free_port()),
         "--termination-log", str(term)],
        capture_output=True, text=True, timeout=deadline + 60, check=False)
    return res, term


def test_standalone_runs_on_loopback_and_writes_the_termination_log(tmp_path: Path) -> None:
    res, term = run_standalone(tmp_path, 60.0)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["passed"] is True and "2 rank(s), step 1" in str(doc["detail"])
    assert json.loads(term.read_text()) == doc


def test_standalone_failure_puts_the_rank_logs_on_stderr(tmp_path: Path) -> None:
    res, term = run_standalone(tmp_path, 0.3)  # torch's import alone takes longer
    assert res.returncode == 1
    doc = json.loads(term.read_text())
    assert doc["passed"] is False and "rank 0 did not finish within 0.3 s" in str(doc["detail"])
    assert str(doc["detail"]).endswith("(rank logs on stderr)")
    assert "--- rank-0.log" in res.stderr and "--- rank-1.log" in res.stderr


def test_without_standalone_the_base_dir_and_hosts_file_are_required() -> None:
    argv = [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--node", "n", "--gpus", "1"]
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert "--base-dir is required (or --standalone)" in res.stderr
    assert "--hosts-file is required (or --standalone)" in res.stderr


def test_standalone_refuses_a_base_dir(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.sandbox.training.smoke", "--standalone", "--node", "n",
         "--gpus", "1", "--base-dir", str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "--standalone makes its own --base-dir and --hosts-file" in res.stderr
