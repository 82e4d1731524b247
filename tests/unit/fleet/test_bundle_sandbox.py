"""A sandbox node's collectors come from the state file (the public interface): the agent socket,
gpu-health.json from the agent's Launch recipe, the kernel log, Slurm's view, the links, the metrics
window and every daemon log of the node; --since and the caps are checked at the edge."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpufleet.core.sandbox_contract import Launch, SandboxNode, SandboxProcess, SandboxState
from gpufleet.fleet.bundle import sandbox as SB
from gpufleet.fleet.bundle.caps import SANDBOX_CAPS
from gpufleet.fleet.bundle.runner import ReadError, run_one
from gpufleet.fleet.bundle.service import BundleInputError, collect_sandbox, make_caps, parse_since


def _state(tmp_path: Path, prometheus_url: str | None = "http://127.0.0.1:9") -> SandboxState:
    node_dir = tmp_path / "nodes" / "gpu-1"
    node_dir.mkdir(parents=True)
    (node_dir / "kern.log").write_text("NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.\n")
    (node_dir / "gpu-health.json").write_text('{"gpus": {"3": {"xid": 79}}}')
    (node_dir / "agent.log").write_text("agent started\n")
    (node_dir / "slurmd.out").write_text("slurmd started\n")
    procs = [
        SandboxProcess(name="agent@gpu-1", pid=1, start_time=0, node="gpu-1", netns="ns-gpu-1", launch=Launch(
            program=["python", "-m", "gpufleet.sandbox.agent", "--state-dir", str(node_dir)],
            log=str(node_dir / "agent.log"))),
        SandboxProcess(name="slurmd@gpu-1", pid=2, start_time=0, node="gpu-1", netns="ns-gpu-1",
                       launch=Launch(program=["slurmd", "-D"], log=str(node_dir / "slurmd.out"))),
        SandboxProcess(name="slurmd@gpu-2", pid=3, start_time=0, node="gpu-2", launch=Launch(
            program=["slurmd"], log="/nonexistent")),
    ]
    nodes = [SandboxNode(name=n, role="compute", netns=f"ns-{n}", mgmt_ifname="mgmt0", mgmt_peer=f"p-{n}",
                         mgmt_address="10.0.0.2/24", agent_socket=str(node_dir / "agent.sock"),
                         kernel_log=str(node_dir / "kern.log")) for n in ("gpu-1", "gpu-2")]
    return SandboxState(stack="sandbox", run_id="abc", phase="up", base_dir=str(tmp_path), created_at=0,
                        head_netns="ns-head", slurm_conf="/x/slurm.conf", nodes=nodes, processes=procs,
                        prometheus_url=prometheus_url, agent_token_file=str(tmp_path / "token"))


def test_collectors_of_a_node_in_the_order_a_reader_asks_for_them(tmp_path: Path) -> None:
    cs = SB.collectors(_state(tmp_path), "gpu-1", 100.0, 460.0)
    assert [(c.name, c.member) for c in cs] == [
        ("agent-state", "agent/state.json"), ("gpu-health", "agent/gpu-health.json"),
        ("kernel-log", "kernel/kern.log"), ("slurm-node", "slurm/scontrol-show-node.txt"),
        ("fabric-links", "fabric/ip-link.txt"), ("metrics", "metrics/query_range.json"),
        ("log:agent@gpu-1", "logs/agent@gpu-1.log"), ("log:slurmd@gpu-1", "logs/slurmd@gpu-1.log")]
    by = {c.name: c for c in cs}
    assert list(by["slurm-node"].command) == ["ip", "netns", "exec", "ns-head", "env",
                                              "SLURM_CONF=/x/slurm.conf", "scontrol", "show", "node", "gpu-1"]
    assert list(by["fabric-links"].command) == ["ip", "-n", "ns-gpu-1", "-s", "-d", "link", "show"]
    assert run_one(by["gpu-health"], 3, 1000).data == b'{"gpus": {"3": {"xid": 79}}}'
    assert b"Xid" in run_one(by["kernel-log"], 3, 1000).data
    out = run_one(by["agent-state"], 3, 1000)  # no token file, no agent: recorded, not raised
    assert out.status == "failed" and out.error


def test_the_epilog_log_is_collected_once_slurm_has_written_it(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (tmp_path / "nodes" / "gpu-1" / "epilog.log").write_text("gpu-1: OK\n")
    assert SB.collectors(state, "gpu-1", 0, 1)[-1].member == "logs/epilog.log"


def test_window_and_query() -> None:
    assert SB.window(1000.0, 1010.0) == (700.0, 1010.0)  # collected at detection: up to now
    assert SB.window(1000.0, 5000.0) == (700.0, 1060.0)  # collected later: 60 s after
    assert SB.window(1000.0, 1010.0, since=900.0) == (900.0, 1010.0)
    with pytest.raises(ValueError, match="empty window"):
        SB.window(1000.0, 1010.0, since=2000.0)
    assert SB.metrics_expr('gpu-"1') == '{node="gpu-\\"1"}'
    assert SB.step_for(0, 360) == 1.0 and SB.step_for(0, 4000) == 10.0


SERIES = [{"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "node": "gpu-1"}, "values": [[1, "0"]]}]


class _Prom(BaseHTTPRequestHandler):
    seen: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        _Prom.seen.append(q)
        if q["query"] == ['{node="bad"}']:
            body, code = {"status": "error", "error": "parse error"}, 400
        else:
            body, code = {"status": "success", "data": {"resultType": "matrix", "result": SERIES}}, 200
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Prom)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_query_range_over_http(prom: str) -> None:
    result = SB.query_range(prom, '{node="gpu-1"}', 100.0, 460.0, 1.0, 5)
    assert result == SERIES
    assert _Prom.seen[-1] == {"query": ['{node="gpu-1"}'], "start": ["100.000"], "end": ["460.000"],
                              "step": ["1"]}
    with pytest.raises(ReadError, match="HTTP 400"):
        SB.query_range(prom, '{node="bad"}', 100.0, 460.0, 1.0, 5)
    with pytest.raises(ReadError, match=r"Prometheus http://127\.0\.0\.1:9"):
        SB.query_range("http://127.0.0.1:9", "up", 0, 1, 1, 2)


def test_collect_sandbox_refuses_an_unknown_node_and_writes_a_bundle_for_a_known_one(
        tmp_path: Path, prom: str) -> None:
    state = _state(tmp_path, prom)
    with pytest.raises(BundleInputError, match="no node 'gpu-9' in sandbox sandbox; nodes: gpu-1, gpu-2"):
        collect_sandbox(state, "gpu-9", tmp_path / "out", SANDBOX_CAPS)
    now = time.time()
    path, manifest = collect_sandbox(state, "gpu-1", tmp_path / "out", SANDBOX_CAPS, trigger="node-health",
                                     reason="XID 79", detected_at=now)
    assert path.parent == tmp_path / "out" and manifest.window is not None
    assert manifest.window[1] <= time.time() and manifest.window[0] == pytest.approx(now - 300)
    status = {m.collector: m.status for m in manifest.members}
    assert status["metrics"] == "ok" and status["gpu-health"] == "ok" and status["agent-state"] == "failed"


def test_since_accepts_durations_unix_seconds_and_zoned_iso_times() -> None:
    now = 10_000.0
    assert parse_since("90s", now) == 9910.0 and parse_since("10m", now) == 9400.0
    assert parse_since("2h", now) == now - 7200 and parse_since("1d", now) == now - 86400
    assert parse_since("1765000000", now) == 1765000000.0
    assert parse_since("2026-12-05T05:00:00Z", now) == 1796446800.0
    bad_input = [("yesterday", "not a duration"), ("2026-12-05T05:00:00", "time zone"), ("-5", "positive")]
    for bad, why in bad_input:
        with pytest.raises(BundleInputError, match=why):
            parse_since(bad, now)


def test_caps_from_the_user_are_kept_and_checked() -> None:
    caps = make_caps(SANDBOX_CAPS, timeout_s=1.5, total_mib=32, deadline_s=4)
    assert (caps.collector_timeout_s, caps.total_bytes, caps.deadline_s) == (1.5, 32 * 1024 * 1024, 4)
    assert caps.collector_bytes == SANDBOX_CAPS.collector_bytes
    with pytest.raises(BundleInputError, match="collector_timeout_s: Input should be greater than 0"):
        make_caps(SANDBOX_CAPS, timeout_s=0)
    with pytest.raises(BundleInputError, match="over the total cap"):
        make_caps(SANDBOX_CAPS, collector_mib=100, total_mib=10)


def test_the_hook_finishes_its_bundle_before_the_node_health_check_would_kill_it() -> None:
    from gpufleet.fleet.bundle.hook import deadline_within

    assert deadline_within(6.0, None, 100.0) == 6.0
    assert deadline_within(6.0, "110.0", 100.0) == 6.0  # plenty of time left
    assert deadline_within(6.0, "104.0", 100.0) == 3.0  # started late on a loaded machine
    assert deadline_within(6.0, "100.2", 100.0) == 0.5  # too late: still try, briefly
    assert deadline_within(6.0, "soon", 100.0) == 6.0
    assert deadline_within(6.0, "106.0", 100.0, margin_s=3.0) == 3.0  # shipping keeps more back
