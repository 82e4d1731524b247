"""A real 2-rank data-parallel PyTorch run over gloo on 127.0.0.1 (lo): steps, checkpoints, a restart that
resumes from the newest checkpoint, progress on /metrics, and a fatal GPU fault failing the rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(tmp: Path, *, job: int, restart: int, max_steps: int, metrics_port: int, rdv_port: int,
           step_sleep: float = 0.0, pg_timeout: float = 10.0) -> list[subprocess.Popen[bytes]]:
    lo = {"mgmt_ip": "127.0.0.1", "fabric_ip": "127.0.0.1", "fabric_ifname": "lo"}
    hosts = {n: lo for n in ("n0", "n1")}
    (tmp / "hosts.json").write_text(json.dumps(hosts))
    procs = []
    for r in (0, 1):
        env = {**os.environ, "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_NODEID": str(r),
               "SLURM_LOCALID": "0", "SLURMD_NODENAME": f"n{r}", "SLURM_JOB_NODELIST": "n[0-1]",
               "SLURM_JOB_ID": str(job), "SLURM_RESTART_COUNT": str(restart), "SLURM_JOB_NAME": "t"}
        env.pop("GLOO_SOCKET_IFNAME", None)
        with open(tmp / f"rank{r}.err", "ab") as err:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpufleet.sandbox.training.train", "--base-dir", str(tmp),
                 "--checkpoint-dir", str(tmp / "ckpt"), "--events-file", str(tmp / "events.jsonl"),
                 "--file-sd-dir", str(tmp / "sd"), "--hosts-file", str(tmp / "hosts.json"),
                 "--checkpoint-every", "5", "--step-sleep", str(step_sleep), "--max-steps", str(max_steps),
                 "--pg-timeout", str(pg_timeout), "--metrics-port", str(metrics_port),
                 "--rendezvous-port", str(rdv_port)],
                env=env, stdout=subprocess.DEVNULL, stderr=err,
            ))
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)


def events(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (tmp / "events.jsonl").read_text().splitlines()]


def test_train_checkpoint_restart_resume(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "n0").mkdir(parents=True)
    (tmp_path / "nodes" / "n1").mkdir(parents=True)
    mport = free_port()
    assert wait_all(launch(tmp_path, job=7, restart=0, max_steps=12, metrics_port=mport,
                           rdv_port=free_port())) == [0, 0], (tmp_path / "rank0.err").read_text()
    ev = events(tmp_path)
    assert {(e["event"], e["rank"]) for e in ev if e["event"] in ("start", "exit")} == {
        ("start", 0), ("start", 1), ("exit", 0), ("exit", 1)}
    assert [e["step"] for e in ev if e["event"] == "checkpoint"] == [5, 10]
    assert next(e for e in ev if e["event"] == "step")["step"] == 1  # first step always recorded
    sd = json.loads(next((tmp_path / "sd").iterdir()).read_text())
    assert sd[0]["targets"] == [f"127.0.0.1:{mport}"]

    # The "requeued" incarnation resumes from step 10 and scrapes show its progress.
    procs = launch(tmp_path, job=7, restart=1, max_steps=25, metrics_port=mport, rdv_port=free_port(),
                   step_sleep=0.1)
    scraped = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        try:
            text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=2).text
            if "gpufleet_training_step{" in text:
                scraped = text
                step = float(next(ln.split()[-1] for ln in text.splitlines()
                                  if ln.startswith("gpufleet_training_step{")))
                if step >= 15:
                    break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert wait_all(procs) == [0, 0], (tmp_path / "rank0.err").read_text()
    assert 'gpufleet_training_restarts_total{job_name="t",slurm_job_id="7"} 1.0' in scraped
    assert 'gpufleet_training_world_size{job_name="t",slurm_job_id="7"} 2.0' in scraped
    assert "gpufleet_training_last_checkpoint_step{" in scraped
    ev = [e for e in events(tmp_path) if e["restart"] == 1]
    resume = next(e for e in ev if e["event"] == "resume")
    assert resume["step"] == 10 and resume["checkpoint"] == "ckpt-0000000007-000000-000000010"
    first = next(e for e in ev if e["event"] == "step")
    assert first["step"] == 11
    assert [e["step"] for e in ev if e["event"] == "checkpoint"] == [15, 20, 25]
    names = sorted(p.name for p in (tmp_path / "ckpt").glob("*[0-9].json"))  # manifests
    assert names == [f"ckpt-0000000007-000001-0000000{s}.json" for s in (15, 20, 25)]  # keep 3
    assert sorted(p.name for p in (tmp_path / "ckpt" / "fence").iterdir()) == [
        "gen-0000000007-000000", "gen-0000000007-000001"]
    # Step events are throttled: the first, then at most one per second.
    steps = [e for e in ev if e["event"] == "step"]
    span = steps[-1]["t"] - steps[0]["t"]
    assert len(steps) <= 2 + span and len(steps) < 15


def test_fatal_gpu_fault_fails_the_rank_with_a_cuda_error(tmp_path: Path) -> None:
    for n in ("n0", "n1"):
        (tmp_path / "nodes" / n).mkdir(parents=True)
    # The node agent's verdict: n1's GPU 0 fell off the bus (fatal); n0's GPU 0 had an XID 45 (not).
    (tmp_path / "nodes" / "n1" / "gpu-health.json").write_text(json.dumps({"gpus": {"0": {
        "fatal": True, "xid": 79, "since": 1.0,
        "error": "CUDA error: unspecified launch failure (Xid 79: GPU has fallen off the bus)"}}}))
    (tmp_path / "nodes" / "n0" / "gpu-health.json").write_text(json.dumps({"gpus": {"0": {
        "fatal": False, "xid": 45, "since": 1.0, "error": "x"}}}))
    # Both ranks end by themselves (wait_all raises if one still runs after its bound): no timing is
    # asserted here, the machine may be loaded (benchmarks/ measure times).
    rcs = wait_all(launch(tmp_path, job=8, restart=0, max_steps=1000, metrics_port=free_port(),
                          rdv_port=free_port(), pg_timeout=3))
    assert rcs[1] == 1 and rcs[0] == 1  # rank 1 dies of its GPU; rank 0 then times out in gloo
    errs = {e["rank"]: e["message"] for e in events(tmp_path) if e["event"] == "error"}
    assert errs[1] == ("RuntimeError: CUDA error: unspecified launch failure "
                       "(Xid 79: GPU has fallen off the bus)")
    assert "CUDA" not in errs[0]  # rank 0's own GPU is fine: it fails only because its peer is gone


def test_a_failed_checkpoint_write_is_counted_not_a_crash(tmp_path: Path) -> None:
    """EROFS (the sandbox's checkpoint-store outage: a read-only bind mount) or EIO while writing a
    checkpoint: the rank keeps training, counts the failure (gpufleet_training_checkpoint_failures_total,
    the StorageCheckpointWriteFailing alert's signal) and records a `checkpoint_failed` event."""
    import argparse
    import errno

    import torch
    from prometheus_client import CollectorRegistry, generate_latest

    from gpufleet.sandbox.training import train
    from gpufleet.sandbox.training.checkpoint import CheckpointDir
    from gpufleet.sandbox.training.progress import EventContext, EventLog, TrainingCollector, TrainingProgress

    class FailingStore(CheckpointDir):
        def __init__(self, root: Path) -> None:
            super().__init__(root)
            self.failures: list[int] = [errno.EROFS, errno.EIO]

        def write(self, gen: Any, step: int, payload: bytes, meta: dict[str, Any]) -> Any:
            if self.failures:
                code = self.failures.pop(0)
                raise OSError(code, os.strerror(code))
            return super().write(gen, step, payload, meta)

    t = object.__new__(train.Trainer)
    t.torch = torch
    t.model = torch.nn.Linear(2, 1)
    t.opt = torch.optim.SGD(t.model.parameters(), lr=0.1)
    t.gen, t.step = (5, 0), 20
    t.ckpt = FailingStore(tmp_path / "ckpt")
    t.args = argparse.Namespace(keep_checkpoints=3)
    t.info = type("I", (), {"world_size": 2, "node": "n0"})()
    t.progress = TrainingProgress(5, "t", 2, 0)
    t.events = EventLog(tmp_path / "events.jsonl", EventContext(5, 0, "n0", 0))
    t.save()  # EROFS
    t.step = 40
    t.save()  # EIO
    t.step = 60
    t.save()  # the store is back
    ev = events(tmp_path)
    assert [(e["event"], e["step"], e.get("errno")) for e in ev] == [
        ("checkpoint_failed", 20, "EROFS"), ("checkpoint_failed", 40, "EIO"), ("checkpoint", 60, None)]
    written = t.ckpt.keys()
    assert [k.step for k in written] == [60]
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TrainingCollector(t.progress))
    text = generate_latest(reg).decode()
    assert 'gpufleet_training_checkpoint_failures_total{job_name="t",slurm_job_id="5"} 2.0' in text
    assert 'gpufleet_training_last_checkpoint_step{job_name="t",slurm_job_id="5"} 60.0' in text
