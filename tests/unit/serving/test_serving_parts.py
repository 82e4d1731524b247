"""The serving parts that need no process: HAProxy's configuration, its stats, the load's bounds and
its records."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos.serving.load import LOCUSTFILE, LoadSpec, bins, failure_reasons, locust_argv
from gpufleet.core.haproxy_stats import parse_server_states
from gpufleet.core.serving_records import RequestLine, read_records
from gpufleet.sandbox.serving.balancer import (
    Backend,
    BalancerConfig,
    check_bound_seconds,
    haproxy_config,
)
from gpufleet.sandbox.serving.replica import IN_FEATURES, ReplicaServer, parse_inputs

REPLICAS = (Backend("gpu-2", "10.77.0.12", 8080), Backend("gpu-3", "10.77.0.13", 8080))


def test_haproxy_config_checks_readiness_and_retries_only_unanswered_requests() -> None:
    text = haproxy_config(BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS), "/run/x/haproxy.pid")
    lines = [x.strip() for x in text.splitlines()]
    assert "bind 10.77.0.1:8080" in lines and "bind 10.77.0.1:8404" in lines
    assert "http-check send meth GET uri /ready" in lines and "http-check expect status 200" in lines
    assert ("default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions "
            "observe layer7 error-limit 1 on-error mark-down") in lines
    active_only = haproxy_config(BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS, passive=False), "/p")
    assert "default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions\n" in active_only
    assert "retry-on conn-failure empty-response response-timeout 503" in lines
    assert [x for x in lines if x.startswith("server ")] == [
        "server gpu-2 10.77.0.12:8080 check",
        "server gpu-3 10.77.0.13:8080 check",
    ]
    live = haproxy_config(BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS, health="live"), "/p")
    assert "http-check send meth GET uri /live" in live
    none = haproxy_config(BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS, health="none"), "/p")
    assert "httpchk" not in none and "server gpu-2 10.77.0.12:8080\n" in none


def test_balancer_config_is_checked() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        BalancerConfig("10.77.0.1", 8080, 8404, ())
    with pytest.raises(ValueError, match="unique"):
        BalancerConfig("10.77.0.1", 8080, 8404, (REPLICAS[0], REPLICAS[0]))
    with pytest.raises(ValueError, match="positive"):
        BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS, fall=0)
    # A replica that fails readiness is out within fall x inter + one check's timeout.
    assert check_bound_seconds(BalancerConfig("10.77.0.1", 8080, 8404, REPLICAS)) == 1.5


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy (Debian package haproxy) not installed")
def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    for health in ("ready", "live", "none"):
        cfg = tmp_path / f"{health}.cfg"
        cfg.write_text(
            haproxy_config(
                BalancerConfig("127.0.0.1", 18080, 18404, REPLICAS, health=health),  # type: ignore[arg-type]
                str(tmp_path / "pid"),
            )
        )
        res = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_server_states_from_haproxy_stats_csv() -> None:
    csv = (
        "# pxname,svname,qcur,status,weight\n"
        "serving,FRONTEND,,OPEN,\n"
        "replicas,gpu-2,0,UP,1\n"
        "replicas,gpu-3,0,DOWN,1\n"
        "replicas,BACKEND,0,UP,1\n"
    )
    assert parse_server_states(csv) == {"gpu-2": "UP", "gpu-3": "DOWN"}
    with pytest.raises(ValueError, match="not HAProxy stats CSV"):
        parse_server_states("<html>")


def test_load_spec_bounds_every_loop() -> None:
    ok = LoadSpec("http://10.77.0.1:8080", users=20, rate_per_user=2, duration_s=60)
    argv = locust_argv(ok, Path("/r"), python="/venv/bin/python")
    assert argv[:5] == ["/venv/bin/python", "-m", "locust", "-f", str(LOCUSTFILE)]
    joined = " ".join(argv)
    for part in (
        "--headless",
        "--users 20",
        "--spawn-rate 20",
        "--run-time 60s",
        "--stop-timeout 5",
        "--gpufleet-records /r",
        "--gpufleet-rate-per-user 2",
        "--exit-code-on-error 0",
    ):
        assert part in joined
    assert ok.offered_rate == 40
    bad = LoadSpec("10.77.0.1:8080", users=0, rate_per_user=50, duration_s=3600)
    assert len(bad.problems()) == 3
    with pytest.raises(ValueError, match=r"users must be 1\.\.200"):
        locust_argv(bad, Path("/r"))
    assert LoadSpec("http://x:1", users=100, rate_per_user=30, duration_s=10).problems() == [
        "rate must be > 0 and users x rate <= 2000/s, got 100 x 30"
    ]


def test_records_of_every_process_merge_into_bins(tmp_path: Path) -> None:
    t0 = 1_000.0
    (tmp_path / "requests-11.jsonl").write_text(
        RequestLine(t=t0 + 0.1, latency_s=0.02, ok=True, status=200, replica="gpu-2").line()
        + RequestLine(t=t0 + 1.1, ok=False, missed=True).line()
        + '{"t": 1002.0, "lat'
    )  # torn last line
    (tmp_path / "requests-12.jsonl").write_text(
        RequestLine(t=t0 + 0.5, latency_s=0.5, ok=False, status=500, error="HTTP 500").line()
    )
    (tmp_path / "requests-14.jsonl").write_text(
        RequestLine(t=t0 + 0.6, latency_s=5.0, ok=False, status=0, error="ConnectionResetError(104)").line()
        + RequestLine(t=t0 + 0.7, latency_s=0.1, ok=False, status=503, error="HTTP 503").line()
    )
    assert failure_reasons(tmp_path) == {"missed": 1, "HTTP 500": 1, "ConnectionResetError(104)": 1,
                                         "HTTP 503": 1}
    (tmp_path / "requests-14.jsonl").unlink()
    got = bins(tmp_path, t0)
    assert sorted(got) == [0, 1]
    assert (got[0].due, got[0].ok, got[0].missed) == (2, 1, 0)
    assert (got[1].due, got[1].ok, got[1].missed) == (1, 0, 1)
    (tmp_path / "requests-13.jsonl").write_text(json.dumps({"t": 1.0, "ok": "maybe"}) + "\n")
    with pytest.raises(ValueError, match=r"requests-13.jsonl: line 1: not a request record: ok"):
        read_records(tmp_path)


def test_a_burst_of_connections_is_queued_not_dropped() -> None:
    """A stalled replica's requests are retried on the other one all at once, each on a new
    connection: 40 connects before it accepts any must all complete within HAProxy's 100 ms connect
    timeout (socketserver's default backlog of 5 dropped the SYNs past the 6th)."""
    server = ReplicaServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # never accepts in this test
    socks: list[socket.socket] = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.settimeout(0.1)
            s.connect(server.server_address)
            socks.append(s)
        assert len(socks) == 40
    finally:
        for s in socks:
            s.close()
        server.server_close()


def test_replica_input_is_checked() -> None:
    assert parse_inputs(b"") is None
    assert parse_inputs(json.dumps({"inputs": [[1] * IN_FEATURES]}).encode()) == [[1.0] * IN_FEATURES]
    for bad in ({"inputs": []}, {"inputs": [[1] * 3]}, {"inputs": [["x"] * IN_FEATURES]}, [1]):
        with pytest.raises(ValueError, match="expected"):
            parse_inputs(json.dumps(bad).encode())


def test_a_hung_gpu_trips_the_engine_watchdog_and_readiness_sees_it(tmp_path: Path) -> None:
    # Nothing in the health document says "error": readiness fails only because a pass runs past its
    # deadline (the GPU hang without an XID); waiting and new requests fail at once with
    # EngineStalled (the replica's 503, which the balancer retries elsewhere); the GPU reset ends it.
    from gpufleet.sandbox.agent.state import health_doc, initial_state, write_json_atomic
    from gpufleet.sandbox.serving.replica import Engine, ReplicaConfig

    health = tmp_path / "gpu-health.json"
    write_json_atomic(health, health_doc(initial_state("srv-0", 1, 0.0)))
    engine = Engine(ReplicaConfig("srv-0", "127.0.0.1", 0, health, 0, stall_s=5.0, timeout_s=5.0,
                                  canary_s=0.05, pass_deadline_s=0.2))
    engine.start()
    try:
        _hang_and_reset(engine, health)
    finally:
        engine.stop()


def _hang_and_reset(engine: Any, health: Path) -> None:
    from gpufleet.sandbox.agent.state import clear, hang, health_doc, initial_state, write_json_atomic
    from gpufleet.sandbox.serving.replica import EngineStalled

    assert engine.readiness() == (True, "ready")
    assert len(engine.submit(None).result(timeout=5.0)[0]) == 8
    hung = hang(initial_state("srv-0", 1, 0.0), 0, 1.0)
    write_json_atomic(health, health_doc(hung))
    queued = engine.submit(None)  # waits behind the hung pass
    with pytest.raises(EngineStalled):
        queued.result(timeout=2.0)  # failed by the watchdog, long before its 5 s timeout
    ok, why = engine.readiness()
    assert not ok and why.startswith("engine stalled"), why
    t0 = time.monotonic()
    with pytest.raises(EngineStalled):
        engine.submit(None).result(timeout=1.0)  # refused at once while stalled
    assert time.monotonic() - t0 < 0.5
    write_json_atomic(health, health_doc(clear(hung, 0, 2.0)))
    deadline = time.monotonic() + 5.0
    while not engine.readiness()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.readiness() == (True, "ready")
    assert len(engine.submit(None).result(timeout=5.0)[0]) == 8


def test_runtime_api_commands_are_checked() -> None:
    from gpufleet.core.haproxy_runtime import set_state_command

    assert set_state_command("srv-0", "drain") == "set server replicas/srv-0 state drain"
    for bad in ("srv 0", "srv;0", ""):
        with pytest.raises(ValueError, match="server name"):
            set_state_command(bad, "drain")
    with pytest.raises(ValueError, match="state must be"):
        set_state_command("srv-0", "down")  # type: ignore[arg-type]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy (Debian package haproxy) not installed")
def test_a_real_haproxy_drains_and_readies_a_server_on_its_admin_socket(tmp_path: Path) -> None:
    # The runtime API a rolling restart uses, against HAProxy itself on loopback: drain takes the
    # server out of the rotation (DRAIN in the stats page), ready puts it back; a wrong name is refused.
    import socket as sk

    from gpufleet.core.haproxy_runtime import set_server_state
    from gpufleet.core.haproxy_stats import in_rotation, parse_server_states, stats_csv

    ports = []
    for _ in range(2):
        with sk.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    sock = str(tmp_path / "haproxy.sock")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(BalancerConfig("127.0.0.1", ports[0], ports[1], REPLICAS, health="none",
                                                 admin_socket=sock), str(tmp_path / "pid")))
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{ports[1]}/stats;csv"
        deadline = time.monotonic() + 10
        while not Path(sock).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

        def states() -> dict[str, str]:
            return parse_server_states(stats_csv(url))

        assert all(in_rotation(v) for v in states().values()), states()
        set_server_state(sock, "gpu-2", "drain")
        assert states()["gpu-2"] == "DRAIN" and in_rotation(states()["gpu-3"])
        assert not in_rotation(states()["gpu-2"])
        set_server_state(sock, "gpu-2", "ready")
        assert in_rotation(states()["gpu-2"])
        with pytest.raises(RuntimeError, match="No such server"):
            set_server_state(sock, "gpu-9", "drain")
    finally:
        proc.terminate()
        proc.wait(10)
