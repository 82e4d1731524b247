"""Replicas and HAProxy as plain processes on loopback, for the benchmark and the tests that need no
sandbox: the same programs the sandbox runs (replica.py, Debian's haproxy), started and stopped here.
Every address is 127.0.0.1."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType

from gpufleet.core.haproxy_stats import server_states
from gpufleet.core.sandbox_contract import AGENT_HEALTH_FILE
from gpufleet.sandbox.agent.state import hang, health_doc, initial_state, write_json_atomic
from gpufleet.sandbox.serving.balancer import (
    Backend,
    BalancerConfig,
    Health,
    haproxy_config,
)

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except (OSError, urllib.error.URLError):
        return 0, ""


def answers_ok(url: str) -> bool:
    return http_get(url)[0] == 200


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> float:
    """Seconds it took until ok() held; AssertionError naming `what` past the timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ok():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def write_fatal_fault(health_file: Path, xid: int = 79) -> None:
    """A fatal fault on GPU 0 in the node agent's gpu-health.json format, written atomically as the
    agent writes it."""
    doc = {
        "node": health_file.parent.name,
        "gpus": {
            "0": {
                "fatal": True,
                "xid": xid,
                "fault_id": f"gpu-xid-{xid}",
                "since": time.time(),
                "error": f"CUDA error: unspecified launch failure (GPU 0, Xid {xid})",
            }
        },
    }
    tmp = health_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(health_file)


def write_gpu_hang(health_file: Path) -> None:
    """GPU 0 hung (no XID, no error: its passes stop completing), in the agent's own document."""
    state = hang(initial_state(health_file.parent.name, 1, time.time()), 0, time.time())
    write_json_atomic(health_file, health_doc(state))


@dataclass
class LocalReplica:
    backend: Backend
    health_file: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpufleet.sandbox.serving.replica",
                    "--name",
                    self.backend.name,
                    "--listen",
                    f"{self.backend.ip}:{self.backend.port}",
                    "--health-file",
                    str(self.health_file),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def url(self, path: str) -> str:
        return f"http://{self.backend.ip}:{self.backend.port}{path}"

    def kill(self) -> None:
        """SIGKILL, as a crash does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class LocalServing:
    """N replicas on loopback; `balancer(health)` starts an HAProxy in front of them."""

    workdir: Path
    replicas: int = 2
    members: list[LocalReplica] = field(default_factory=list)
    _haproxy: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServing:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for i in range(self.replicas):
            name = f"rep-{i}"
            (self.workdir / name).mkdir(exist_ok=True)
            r = LocalReplica(
                Backend(name, LOOPBACK, free_port()),
                self.workdir / name / AGENT_HEALTH_FILE,
                self.workdir / f"{name}.log",
            )
            r.start()
            self.members.append(r)
        self.wait_ready()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_balancer()
        for r in self.members:
            r.stop()

    def wait_ready(self, timeout: float = 90.0) -> None:
        for r in self.members:
            wait_for(f"{r.backend.name} ready ({r.log})", partial(answers_ok, r.url("/ready")), timeout)

    def heal(self) -> None:
        """Every fault undone and every replica running and ready again."""
        for r in self.members:
            r.health_file.unlink(missing_ok=True)
            if r.proc is None or r.proc.poll() is not None:
                r.start()
        self.wait_ready()

    def balancer(self, health: Health) -> BalancerConfig:
        self.stop_balancer()
        cfg = BalancerConfig(
            LOOPBACK, free_port(), free_port(), tuple(r.backend for r in self.members), health=health
        )
        path = self.workdir / f"haproxy-{health}.cfg"
        path.write_text(haproxy_config(cfg, str(self.workdir / f"haproxy-{health}.pid")))
        with open(self.workdir / f"haproxy-{health}.log", "ab") as err:
            self._haproxy = subprocess.Popen(
                ["haproxy", "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=err
            )
        stats = self.stats_url(cfg)
        if health == "none":
            wait_for("haproxy", lambda: http_get(stats)[0] == 200, 20)
        else:
            wait_for("every server UP", lambda: set(self.server_states(cfg).values()) == {"UP"}, 20)
        return cfg

    def stats_url(self, cfg: BalancerConfig) -> str:
        return f"http://{cfg.bind_ip}:{cfg.stats_port}/stats;csv"

    def server_states(self, cfg: BalancerConfig) -> dict[str, str]:
        return server_states(self.stats_url(cfg))

    def stop_balancer(self) -> None:
        if self._haproxy is not None and self._haproxy.poll() is None:
            self._haproxy.terminate()
            self._haproxy.wait(10)
        self._haproxy = None
