"""The agent as a real process: /metrics over HTTP on 127.0.0.1, the control API on a unix socket
with bearer-token auth, files it writes, and state surviving a restart."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from gpufleet.core.host.kernel_log import parse_kernel_log

TOKEN = "s3cret-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AgentProc:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.sock = tmp / "agent.sock"
        (tmp / "token").write_text(TOKEN + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.err: IO[bytes] | None = None

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        self.err = open(self.tmp / "agent.err", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.sandbox.agent", "--node", "gpu-7", "--gpus", "8",
             "--model", "nvidia-h100-sxm", "--listen", f"127.0.0.1:{self.port}",
             "--control-socket", str(self.sock), "--token-file", str(self.tmp / "token"),
             "--state-dir", str(self.tmp / "state"), "--kernel-log", str(self.tmp / "kern.log"),
             "--fabric-ifnames", "lo"],
            stdout=subprocess.DEVNULL, stderr=self.err,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.sock.exists():
                with self.client(TOKEN) as c:
                    try:
                        if c.get("/healthz").status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
            assert self.proc.poll() is None, (self.tmp / "agent.err").read_text()
            time.sleep(0.1)
        raise AssertionError("agent did not come up in 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.err is not None:
            self.err.close()
            self.err = None

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://agent",
                            headers=headers, timeout=5)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProc]:
    a = AgentProc(tmp_path)
    a.start()
    try:
        yield a
    finally:
        a.stop()


def test_control_requires_the_bearer_token(agent: AgentProc) -> None:
    with agent.client(None) as c:
        assert c.get("/state").status_code == 401
        r = c.post("/inject", json={"gpu": 0, "field_id": 230, "value": 79})
        assert r.status_code == 401
    with agent.client("wrong") as c:
        assert c.get("/healthz").status_code == 401
        assert c.post("/clear", json={"gpu": None}).status_code == 401
    with agent.client(TOKEN) as c:
        assert c.get("/healthz").json() == {"node": "gpu-7", "ok": True}
        assert c.post("/inject", json={"gpu": 99, "field_id": 230, "value": 79}).status_code == 400
        assert c.get("/nope").status_code == 404
    # The rejected requests changed nothing.
    assert 'DCGM_FI_DEV_XID_ERRORS{' in agent.metrics()
    assert not (agent.tmp / "kern.log").read_text()


def test_inject_metrics_kmsg_health_restart_and_clear(agent: AgentProc) -> None:
    with agent.client(TOKEN) as c:
        r = c.post("/inject", json={"gpu": 3, "field_id": 230, "value": 79, "kmsg": True})
        assert r.status_code == 200 and r.json()["fatal"] is True
        c.post("/inject", json={"gpu": 3, "field_id": 230, "value": 45, "kmsg": True, "burst": 5})
        c.post("/inject", json={"gpu": 1, "field_id": 310, "value": 17})
    text = agent.metrics()
    assert "# TYPE DCGM_FI_DEV_XID_ERRORS gauge" in text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("DCGM_FI_DEV_XID_ERRORS{") and 'gpu="3"' in ln)
    assert line.endswith(" 45.0") and 'Hostname="gpu-7"' in line and 'device="nvidia3"' in line
    assert 'modelName="NVIDIA H100 80GB HBM3"' in line
    assert any(ln.startswith("DCGM_EXP_XID_ERRORS_COUNT{") and 'xid="45"' in ln and ln.endswith(" 5.0")
               for ln in text.splitlines())
    assert any(ln.startswith("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{") and 'gpu="1"' in ln and ln.endswith(" 17.0")
               for ln in text.splitlines())
    assert 'node_network_receive_bytes_total{device="lo"}' in text

    kern = (agent.tmp / "kern.log").read_text().splitlines()
    assert len(kern) == 6
    assert ("NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.") in kern[0]
    assert all("NVRM: Xid (PCI:0000:5d:00): 45," in ln for ln in kern[1:])
    health = json.loads((agent.tmp / "state" / "gpu-health.json").read_text())
    assert health["gpus"]["3"]["fatal"] is True and health["gpus"]["3"]["xid"] == 79

    agent.stop()
    agent.start()  # injected state survives an agent restart
    assert any(ln.startswith("DCGM_FI_DEV_XID_ERRORS{") and 'gpu="3"' in ln and ln.endswith(" 45.0")
               for ln in agent.metrics().splitlines())
    with agent.client(TOKEN) as c:
        st = c.get("/state").json()
        assert st["gpus"][3]["fault"]["fault_id"] == "gpu-xid-79"
        assert [e["xid"] for e in st["events"]] == [79, 45, 45, 45, 45, 45]
        assert st["fabric"][0]["ifname"] == "lo"
        # A GPU reset of GPU 3 leaves its mark in the node's kernel log: a reader of the log alone
        # (node-health, `inspect --here`) sees the XIDs before it as history, and a new one after it.
        assert c.post("/clear", json={"gpu": 3}).status_code == 200
        log = parse_kernel_log((agent.tmp / "kern.log").read_text().splitlines(), {"0000:5d:00": 3}, 0.0)
        assert len(log.xids) == 6 and log.current == ()
        reset_at = c.get("/state").json()["gpus"][3]["reset_at"]
        assert log.reset_at("0000:5d:00") == pytest.approx(reset_at, abs=1e-5)
        c.post("/inject", json={"gpu": 3, "field_id": 230, "value": 79, "kmsg": True})
        log = parse_kernel_log((agent.tmp / "kern.log").read_text().splitlines(), {"0000:5d:00": 3}, 0.0)
        assert [(x.gpu, x.xid) for x in log.current] == [(3, 79)]
        assert c.post("/clear", json={"gpu": None}).status_code == 200
    kern = (agent.tmp / "kern.log").read_text().splitlines()
    # GPU 3's reset, then one for each of the 8 GPUs at the reboot
    assert sum("gpufleet: GPU reset done (PCI:" in ln for ln in kern) == 1 + 8
    assert parse_kernel_log(kern, {}, 0.0).current == ()
    assert json.loads((agent.tmp / "state" / "gpu-health.json").read_text())["gpus"] == {}
    assert not any(ln.startswith("DCGM_FI_DEV_XID_ERRORS{") and ln.endswith(" 79.0")
                   for ln in agent.metrics().splitlines())
