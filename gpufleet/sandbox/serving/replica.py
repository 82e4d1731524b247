"""`python -m gpufleet.sandbox.serving.replica`: one inference replica on a sandbox node.

A small model (PyTorch, CPU) behind an HTTP server. One engine thread runs every forward pass, as an
inference engine's step loop does; HTTP threads hand it requests and wait. Endpoints:

- `POST /v1/infer` - one forward pass. 200 with the output; 500 with the device error when the GPU
  the replica holds has a fatal fault (the process stays up and keeps answering, as vLLM's does
  after an illegal memory access: vllm#36960); 503 when the engine did not run it (it did not answer
  in time, or its watchdog has declared it stalled): the request was not served and may be sent
  again elsewhere (RFC 9110, 15.6.4), which the balancer does.
- `GET /live` - liveness: 200 while the HTTP server answers. Restarting the process is the only cure
  for a failed liveness check, so it says nothing about the GPU or the engine.
- `GET /ready` - readiness, what the load balancer's health check reads: 200 only when the model
  is loaded, the GPU the replica holds has no fatal fault (the node agent's gpu-health.json), and
  the engine has completed a step (a request, or a canary pass when idle) within `--stall-seconds`.
  The last is what sees a GPU that hangs without an XID (nothing the GPU's exporter publishes says
  so, and the process stays up): the engine's passes stop completing. A pass that runs past
  `--pass-deadline-seconds` trips the engine's watchdog at once (vLLM bounds an engine iteration
  the same way, VLLM_ENGINE_ITERATION_TIMEOUT_S, at 60 s for LLM steps; this model's pass takes a
  few ms): readiness fails, and the requests waiting for the engine, and any that come while it is
  stalled, are answered 503 at once instead of waiting out their timeout. A dead GPU or a stalled
  engine leaves the rotation; a live process alone does not keep it there
  (the blind spot of health checks that only see the HTTP thread: kserve#6259, vllm#39863).

Every answer names the replica (`X-Replica`), so the load generator's records show who served what.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from gpufleet.sandbox.gpu_health import GpuHealth

IN_FEATURES, HIDDEN, OUT_FEATURES = 64, 256, 8
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class ReplicaConfig:
    name: str
    host: str
    port: int
    health_file: Path  # <node dir>/gpu-health.json
    gpu: int
    stall_s: float  # readiness fails when the engine completed no step for this long
    timeout_s: float  # a request the engine did not answer within this is a 503
    canary_s: float  # idle engine: one canary pass this often, so readiness sees it alive
    pass_deadline_s: float = 0.25  # a pass running longer trips the watchdog (the engine is stalled)


class EngineStalled(Exception):
    """The engine's watchdog saw a pass run past its deadline: requests are not being served."""


class Engine:
    """The replica's single engine thread: forward passes in order, a canary when idle; a watchdog
    thread that declares the engine stalled when a pass runs past its deadline."""

    def __init__(self, cfg: ReplicaConfig) -> None:
        import torch

        self.cfg, self.torch = cfg, torch
        torch.set_num_threads(1)  # a sandbox node shares 2 cores with every other node
        torch.manual_seed(1234)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT_FEATURES)
        ).eval()
        self.health = GpuHealth(cfg.health_file, (cfg.gpu,), started_at=time.time())
        self.jobs: queue.Queue[tuple[list[list[float]] | None, Future[list[list[float]]]]] = queue.Queue()
        self.last_step = 0.0  # monotonic time of the last completed pass (0: none yet)
        self.loaded = False
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
        self._lock = threading.Lock()
        self._pass_started: float | None = None  # monotonic start of the pass now running
        self._current: Future[list[list[float]]] | None = None  # the request that pass serves
        self.stalled_since: float | None = None  # set by the watchdog, cleared when a pass completes
        self._stop = threading.Event()

    def start(self) -> None:
        self._forward(None)  # the model is loaded once one pass has run
        self.loaded = True
        self.last_step = time.monotonic()
        self.thread.start()
        self.watchdog.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End both threads (a pass in progress finishes first): torch's threads must not be running
        when the interpreter exits."""
        self._stop.set()
        for t in (self.thread, self.watchdog):
            if t.is_alive():
                t.join(timeout_s)

    def submit(self, inputs: list[list[float]] | None) -> Future[list[list[float]]]:
        fut: Future[list[list[float]]] = Future()
        with self._lock:
            if self.stalled_since is not None:
                fut.set_exception(EngineStalled(self._stall_reason()))
                return fut
            self.jobs.put((inputs, fut))
        return fut

    def _stall_reason(self) -> str:
        assert self.stalled_since is not None
        ran = time.monotonic() - self.stalled_since + self.cfg.pass_deadline_s
        return f"engine stalled: a pass has run {ran:.1f} s (deadline {self.cfg.pass_deadline_s:g} s)"

    def _watch(self) -> None:
        """Trip when the running pass is past its deadline: fail the waiting requests at once."""
        tick = min(0.05, self.cfg.pass_deadline_s / 4)
        while not self._stop.wait(tick):
            with self._lock:
                started = self._pass_started
                if (self.stalled_since is not None or started is None
                        or time.monotonic() - started <= self.cfg.pass_deadline_s):
                    continue
                self.stalled_since = time.monotonic()
                waiting = [self._current] if self._current is not None else []
                while True:
                    try:
                        waiting.append(self.jobs.get_nowait()[1])
                    except queue.Empty:
                        break
                reason = self._stall_reason()
            for fut in waiting:
                if fut is not None and not fut.done():
                    fut.set_exception(EngineStalled(reason))

    def _forward(self, inputs: list[list[float]] | None) -> list[list[float]]:
        # A hung GPU: the pass never completes (the engine thread blocks, so readiness sees no step
        # for longer than --stall-seconds; requests waiting on it time out with 503).
        self.health.wait_while_hung()
        error = self.health.error()
        if error is not None:
            raise RuntimeError(error)
        torch = self.torch
        x = (torch.randn(1, IN_FEATURES) if inputs is None
             else torch.tensor(inputs, dtype=torch.float32))
        with torch.no_grad():
            out = self.model(x)
        return [[round(float(v), 6) for v in row] for row in out]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                inputs, fut = self.jobs.get(timeout=self.cfg.canary_s)
            except queue.Empty:
                inputs, fut = None, None
            with self._lock:
                self._pass_started, self._current = time.monotonic(), fut
            try:
                result: list[list[float]] | RuntimeError = self._forward(inputs)
            except RuntimeError as e:
                # A failed pass is still a step the engine completed: the engine is alive, the GPU is not.
                result = e
            with self._lock:
                self.last_step = time.monotonic()
                self._pass_started, self._current, self.stalled_since = None, None, None
            if fut is not None and not fut.done():  # the watchdog may have failed it already
                if isinstance(result, RuntimeError):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

    def readiness(self) -> tuple[bool, str]:
        if not self.loaded:
            return False, "model not loaded"
        error = self.health.error()
        if error is not None:
            return False, f"device: {error}"
        with self._lock:
            if self.stalled_since is not None:
                return False, self._stall_reason()
        idle = time.monotonic() - self.last_step
        if idle > self.cfg.stall_s:
            return False, f"engine stalled: no step for {idle:.1f} s (limit {self.cfg.stall_s:g} s)"
        return True, "ready"


def parse_inputs(body: bytes) -> list[list[float]] | None:
    """The request body: empty (a seeded input), or {"inputs": [[64 floats], ...]} (1-8 rows)."""
    if not body.strip():
        return None
    doc = json.loads(body)
    rows = doc.get("inputs") if isinstance(doc, dict) else None
    if (not isinstance(rows, list) or not 1 <= len(rows) <= 8
            or not all(isinstance(r, list) and len(r) == IN_FEATURES for r in rows)
            or not all(isinstance(v, int | float) for r in rows for v in r)):
        raise ValueError(f'expected {{"inputs": [[{IN_FEATURES} numbers], ...]}} with 1 to 8 rows')
    return [[float(v) for v in r] for r in rows]


def make_handler(engine: Engine, cfg: ReplicaConfig) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the balancer's connections to servers are

        def log_message(self, format: str, *args: Any) -> None:
            return  # one line per request would be most of the replica's CPU

        def _send(self, code: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Replica", cfg.name)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/live":
                self._send(200, {"live": True})
            elif self.path == "/ready":
                ok, why = engine.readiness()
                self._send(200 if ok else 503, {"ready": ok, "reason": why})
            else:
                self._send(404, {"error": f"no such path: {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/v1/infer":
                self._send(404, {"error": f"no such path: {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
                return
            try:
                inputs = parse_inputs(self.rfile.read(length))
            except ValueError as e:
                self._send(400, {"error": str(e)})
                return
            fut = engine.submit(inputs)
            try:
                out = fut.result(timeout=cfg.timeout_s)
            except TimeoutError:
                self._send(503, {"error": f"engine did not answer within {cfg.timeout_s:g} s"})
                return
            except EngineStalled as e:
                self._send(503, {"error": str(e)})
                return
            except RuntimeError as e:
                self._send(500, {"error": str(e)})
                return
            self._send(200, {"outputs": out})

    return Handler


class ReplicaServer(ThreadingHTTPServer):
    # The listen backlog. socketserver's default is 5: when a stalled replica's watchdog fails its
    # queued requests at once, the balancer retries them all on the other replica in the same
    # millisecond, each on a new connection (http-server-close), and connections past the 5th had
    # their SYN dropped; HAProxy's 100 ms connect timeout then counted an L4 error, and its passive
    # check (error-limit 1) took the healthy replica out too (seen here: HAProxy's log "srv-1 is DOWN,
    # reason: Health analyze ... L4 unsuccessful connection", then 1 s of "no server available").
    # Inference servers listen with a deep backlog (uvicorn's default is 2048); the kernel caps it
    # at net.core.somaxconn.
    request_queue_size = 2048
    daemon_threads = True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.serving.replica", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--listen", required=True, help="IP:PORT")
    p.add_argument("--health-file", type=Path, required=True, help="the node agent's gpu-health.json")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--stall-seconds", type=float, default=2.0)
    p.add_argument("--timeout-seconds", type=float, default=2.0)
    p.add_argument("--canary-seconds", type=float, default=0.5)
    p.add_argument("--pass-deadline-seconds", type=float, default=0.25,
                   help="a forward pass running longer trips the engine's watchdog")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"error: --listen must be IP:PORT, got {args.listen!r}", file=sys.stderr)
        return 2
    cfg = ReplicaConfig(args.name, host, int(port), args.health_file, args.gpu, args.stall_seconds,
                        args.timeout_seconds, args.canary_seconds, args.pass_deadline_seconds)
    engine = Engine(cfg)
    engine.start()
    server = ReplicaServer((cfg.host, cfg.port), make_handler(engine, cfg))

    def stop(signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"replica {cfg.name} serving on {cfg.host}:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.2)
    engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
