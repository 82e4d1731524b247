"""Serving under load on loopback: two real replicas (PyTorch) behind a real HAProxy, driven by real
Locust, a fatal GPU fault on one replica mid-run. With the readiness check the balancer takes the
replica out within its check bound and the run stays available; with a liveness check (the blind
spot) the dead replica keeps half the traffic failing until the end. Figures from gpufleet.slo.serving."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.chaos.serving import load
from gpufleet.sandbox.serving.balancer import (
    Backend,
    BalancerConfig,
    Health,
    check_bound_seconds,
    haproxy_config,
    parse_server_states,
)
from gpufleet.slo.serving import ServingTargets, judge, window

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(
        shutil.which("haproxy") is None, reason="haproxy (Debian package haproxy) not installed"
    ),
]

RUN_S, FAULT_AT_S = 16.0, 6.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(what: str, ok: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def replicas(tmp_path: Path) -> Iterator[tuple[list[Backend], dict[str, Path]]]:
    procs, backends, health = [], [], {}
    for name in ("rep-a", "rep-b"):
        port = free_port()
        health[name] = tmp_path / name / "gpu-health.json"
        health[name].parent.mkdir()
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gpufleet.sandbox.serving.replica",
                        "--name",
                        name,
                        "--listen",
                        f"127.0.0.1:{port}",
                        "--health-file",
                        str(health[name]),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
        backends.append(Backend(name, "127.0.0.1", port))
    try:
        for b in backends:
            wait_for(f"{b.name} ready", lambda b=b: get(f"http://127.0.0.1:{b.port}/ready")[0] == 200)
        yield backends, health
    finally:
        for p, log in procs:
            p.terminate()
            p.wait(10)
            log.close()


def balancer(
    tmp_path: Path, backends: list[Backend], health: Health
) -> tuple[subprocess.Popen[bytes], BalancerConfig]:
    cfg = BalancerConfig("127.0.0.1", free_port(), free_port(), tuple(backends), health=health)
    path = tmp_path / f"haproxy-{health}.cfg"
    path.write_text(haproxy_config(cfg, str(tmp_path / f"haproxy-{health}.pid")))
    with open(tmp_path / f"haproxy-{health}.log", "wb") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=err)
    stats = f"http://127.0.0.1:{cfg.stats_port}/stats;csv"
    wait_for(
        "both servers UP",
        lambda: (
            set(parse_server_states(get(stats)[1]).values()) == {"UP"}
            if health != "none"
            else get(stats)[0] == 200
        ),
    )
    return proc, cfg


def fatal_fault(path: Path) -> None:
    doc = {
        "node": "n",
        "gpus": {
            "0": {
                "fatal": True,
                "xid": 79,
                "fault_id": "gpu-xid-79",
                "since": time.time(),
                "error": "CUDA error: unspecified launch failure (GPU 0, Xid 79)",
            }
        },
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # atomically, as the node agent writes it


def run_once(
    tmp_path: Path, backends: list[Backend], health_files: dict[str, Path], health: Health
) -> tuple[dict[str, object], float | None, float]:
    for p in health_files.values():
        p.unlink(missing_ok=True)
    wait_for(
        "replicas ready again",
        lambda: all(get(f"http://127.0.0.1:{b.port}/ready")[0] == 200 for b in backends),
    )
    proc, cfg = balancer(tmp_path, backends, health)
    try:
        spec = load.LoadSpec(
            f"http://127.0.0.1:{cfg.bind_port}", users=10, rate_per_user=2.0, duration_s=RUN_S
        )
        records = tmp_path / f"records-{health}"
        t0 = time.time()
        locust = load.start(spec, records, tmp_path / f"locust-{health}.log")
        time.sleep(FAULT_AT_S)
        t_fault = time.time()
        fatal_fault(health_files["rep-a"])
        # The replica itself stays up and live, and says why it is not ready.
        assert get(f"http://127.0.0.1:{backends[0].port}/live")[0] == 200
        status, body = get(f"http://127.0.0.1:{backends[0].port}/ready")
        assert status == 503 and "Xid 79" in body
        down_at = None
        if health == "ready":
            stats = f"http://127.0.0.1:{cfg.stats_port}/stats;csv"
            wait_for("rep-a DOWN", lambda: parse_server_states(get(stats)[1]).get("rep-a") == "DOWN", 10)
            down_at = time.time() - t_fault
        assert load.wait(locust, spec) == 0, (tmp_path / f"locust-{health}.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(10)
    bins = load.bins(records, t0)
    targets = ServingTargets(availability=0.999, p99_ms=1000, recover_s=5)
    _, figures = judge(bins, (t0 + 1, t0 + RUN_S - 1), (t_fault, t_fault + 5), targets)
    after = window(bins, t_fault + 3, t0 + RUN_S - 1)
    return figures, down_at, after.availability or 0.0


def test_readiness_takes_a_dead_gpu_out_of_rotation_and_liveness_does_not(
    tmp_path: Path, replicas: tuple[list[Backend], dict[str, Path]]
) -> None:
    backends, health_files = replicas
    ready, down_at, ready_after = run_once(tmp_path, backends, health_files, "ready")
    bound = check_bound_seconds(BalancerConfig("127.0.0.1", 1, 2, tuple(backends)))
    assert down_at is not None and down_at <= bound + 1.0, down_at
    # Every slot of the schedule was either answered or counted: 10 users x 2/s over the judged 14 s.
    assert 250 <= int(ready["due"]) <= 290, ready  # type: ignore[call-overload]
    assert ready_after == 1.0, ready  # once out of rotation, no request fails
    assert ready["recover_seconds"] is not None and float(ready["recover_seconds"]) <= bound + 1.0, ready  # type: ignore[arg-type]
    assert float(ready["availability"]) >= 0.97, ready  # type: ignore[arg-type]

    print(f"readiness: out of rotation {down_at:.2f} s after the fault; {ready}")
    live, _, live_after = run_once(tmp_path, backends, health_files, "live")
    print(f"liveness: availability after the fault {live_after:.3f}; {live}")
    # The liveness check sees a live process: the dead replica keeps its share of the traffic.
    assert 0.3 <= live_after <= 0.7, live
    assert live["recover_seconds"] is None, live
    assert float(live["availability"]) < float(ready["availability"])  # type: ignore[arg-type]
