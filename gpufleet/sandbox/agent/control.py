"""The agent's control endpoint: HTTP/1.1 over a unix socket, bearer-token authenticated.

  GET  /healthz            liveness
  GET  /state              injected state, XID events, fabric link state (what node-health reads)
  POST /inject             {"gpu", "field_id", "value", "kmsg"?, "burst"?}  (dcgmi test --inject)
                           {"gpu", "metric", "value"}  (an AMD / Ascend node: its exporter's series)
  POST /hang               {"gpu"}  (the GPU stops completing work: no XID, no DCGM change)
  POST /clear              {"gpu": int | null}  (GPU reset / node reboot; null = every GPU)
  POST /host               {"signal", "value" | "add", "kill_processes"?}  (BMC, EDAC, disk, port)
  POST /host/clear         {}  (the node was repaired)
Every request needs `Authorization: Bearer <token>`; anything else is 401.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socketserver
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from gpufleet.sandbox.agent.host import parse_host_injection
from gpufleet.sandbox.agent.runtime import Agent
from gpufleet.sandbox.agent.state import parse_hang, parse_injection

log = logging.getLogger("gpufleet.sandbox.agent.control")
MAX_BODY = 64 * 1024


def authorized(header: str | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <token>` header."""
    if not header or not token:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def parse_clear(body: Any, gpus: int) -> int | None:
    if not isinstance(body, dict) or set(body) - {"gpu"}:
        raise ValueError('body must be {"gpu": <int> | null}')
    gpu = body.get("gpu")
    if gpu is None:
        return None
    if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpus:
        raise ValueError(f"gpu must be null or an integer 0..{gpus - 1}")
    return gpu


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # socketserver's default backlog is 5. A unix socket whose backlog is full refuses a connect with
    # a timeout at once (EAGAIN: "Resource temporarily unavailable"), and a node's agent is read by
    # several parties at once (Slurm's health check and Epilog, node-health, a rollout's gate
    # watching every node each second, the diagnostic bundle hook), so a burst read as a dead agent.
    request_queue_size = 256
    agent: Agent
    token: str


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # client_address is '' on unix sockets
        log.debug("control: " + format, *args)

    def _reply(self, code: int, doc: Any) -> None:
        body = json.dumps(doc, sort_keys=True).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _auth(self) -> bool:
        if authorized(self.headers.get("Authorization"), self.server.token):
            return True
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= MAX_BODY:
            self.rfile.read(length)
        self._reply(401, {"error": "missing or wrong bearer token"})
        return False

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        return json.loads(self.rfile.read(length) or b"null")

    def do_GET(self) -> None:
        if not self._auth():
            return
        if self.path == "/healthz":
            self._reply(200, {"ok": True, "node": self.server.agent.node})
        elif self.path == "/state":
            self._reply(200, self.server.agent.state_doc())
        else:
            self._reply(404, {"error": f"no such endpoint: GET {self.path}"})

    def do_POST(self) -> None:
        if not self._auth():
            return
        agent = self.server.agent
        try:
            body = self._body()
            if self.path == "/inject":
                self._reply(200, agent.inject(parse_injection(body, agent.gpus, agent.vendor)))
            elif self.path == "/hang":
                self._reply(200, agent.hang(parse_hang(body, agent.gpus)))
            elif self.path == "/clear":
                self._reply(200, agent.clear(parse_clear(body, agent.gpus)))
            elif self.path == "/host":
                self._reply(200, agent.inject_host(parse_host_injection(body)))
            elif self.path == "/host/clear":
                self._reply(200, agent.clear_host())
            else:
                self._reply(404, {"error": f"no such endpoint: POST {self.path}"})
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            self._reply(400, {"error": str(e)})


def serve_control(path: Path, agent: Agent, token: str) -> _Server:
    """Bind the control socket (mode 0600; a stale socket file from a crash is replaced)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o177)
    try:
        server = _Server(str(path), _Handler)
    finally:
        os.umask(old)
    server.agent, server.token = agent, token
    return server
