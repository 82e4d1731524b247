"""Serving under load on loopback: two real replicas (PyTorch) behind a real HAProxy, driven by real
Locust, a fatal GPU fault on one replica mid-run. With the readiness check the balancer takes the
replica out on its first error answer (the passive check) and keeps it out; with a liveness check
(the blind spot) the probes keep bringing the dead replica back, and requests keep failing to the
end. Figures from gpufleet.slo.serving."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from gpufleet.chaos.serving import load
from gpufleet.sandbox.serving.balancer import BalancerConfig, Health, check_bound_seconds
from gpufleet.sandbox.serving.local import LocalServing, http_get, wait_for, write_fatal_fault
from gpufleet.slo.serving import ServingTargets, judge, window

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(
        shutil.which("haproxy") is None, reason="haproxy (Debian package haproxy) not installed"
    ),
]

RUN_S, FAULT_AT_S = 16.0, 6.0


def run_once(
    tmp_path: Path, serving: LocalServing, health: Health
) -> tuple[dict[str, float | int | None], float | None, float]:
    serving.heal()
    cfg = serving.balancer(health)
    spec = load.LoadSpec(
        f"http://{cfg.bind_ip}:{cfg.bind_port}", users=10, rate_per_user=2.0, duration_s=RUN_S
    )
    records = tmp_path / f"records-{health}"
    t0 = time.time()
    locust = load.start(spec, records, tmp_path / f"locust-{health}.log")
    time.sleep(FAULT_AT_S)
    t_fault = time.time()
    dead = serving.members[0]
    write_fatal_fault(dead.health_file)
    # The replica itself stays up and live, and says why it is not ready.
    assert http_get(dead.url("/live"))[0] == 200
    status, body = http_get(dead.url("/ready"))
    assert status == 503 and "Xid 79" in body
    down_at = None
    if health == "ready":
        wait_for("rep-0 DOWN", lambda: serving.server_states(cfg).get("rep-0") == "DOWN", 10)
        down_at = time.time() - t_fault
    assert load.wait(locust, spec) == 0, (tmp_path / f"locust-{health}.log").read_text()[-2000:]
    bins = load.bins(records, t0)
    targets = ServingTargets(availability=0.999, p99_ms=1000, recover_s=5)
    _, figures = judge(bins, (t0 + 1, t0 + RUN_S - 1), (t_fault, t_fault + 5), targets)
    after = window(bins, t_fault + 3, t0 + RUN_S - 1)
    return figures, down_at, after.availability or 0.0


def test_readiness_takes_a_dead_gpu_out_of_rotation_and_liveness_does_not(tmp_path: Path) -> None:
    with LocalServing(tmp_path / "serving") as serving:
        ready, down_at, ready_after = run_once(tmp_path, serving, "ready")
        # The defaults the balancer ran with (the replica with the fault is still down here).
        bound = check_bound_seconds(
            BalancerConfig("127.0.0.1", 1, 2, tuple(r.backend for r in serving.members))
        )
        print(f"readiness: out of rotation {down_at} s after the fault; {ready}")
        live, _, live_after = run_once(tmp_path, serving, "live")
        print(f"liveness: availability after the fault {live_after:.3f}; {live}")
    assert down_at is not None and down_at <= bound + 1.0, down_at
    # Every slot of the schedule was answered or counted: 10 users x 2/s over the judged 14 s.
    assert 250 <= int(ready["due"] or 0) <= 290, ready
    assert ready_after == 1.0, ready  # once out of rotation, no request fails
    assert ready["recover_seconds"] is not None and float(ready["recover_seconds"]) <= bound + 1.0, ready
    # The passive check takes the replica out on its first error answer: a request or two fail.
    assert int(ready["failed"] or 0) <= 3, ready
    # The liveness check sees a live process: each time its probes bring the dead replica back, the
    # passive check takes it out again on the next request it fails, so failures go on to the end.
    assert live_after < 1.0, live
    assert live["recover_seconds"] is None, live
    assert int(live["failed"] or 0) > int(ready["failed"] or 0), (live, ready)
