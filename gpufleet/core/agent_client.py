"""A client for the sandbox node agent's control socket (HTTP/1.1 over a unix socket, bearer token;
gpufleet.sandbox.agent.control): read by the node-health check (gpufleet.health) and by fleet
inspection (gpufleet.fleet), so it lives here, below both.

http.client, not httpx: the node-health check runs every HealthCheckInterval on every node, and
importing httpx was a quarter of its start-up (0.18 s of ~0.7 s CPU, measured with -X importtime)."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any


class AgentError(Exception):
    """The agent could not be read; the message says why."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def agent_request(socket_path: Path, token: str, method: str, path: str, body: Any = None,
                  timeout: float = 3.0) -> Any:
    """One request to the agent; the decoded JSON answer of a 200, else AgentError."""
    conn = _UnixHTTPConnection(socket_path, timeout)
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
    except (OSError, http.client.HTTPException) as e:
        raise AgentError(f"node agent at {socket_path} unreachable: {getattr(e, 'strerror', None) or e}"
                         ) from None
    finally:
        conn.close()
    if r.status != 200:
        raise AgentError(f"node agent answered HTTP {r.status}: {raw[:200].decode(errors='replace')}")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise AgentError(f"node agent returned no JSON: {e}") from None


def agent_state(socket_path: Path, token: str, timeout: float = 3.0) -> dict[str, Any]:
    """GET /state: the agent's GPUs (a list), XID events, fabric ports and host signals."""
    doc = agent_request(socket_path, token, "GET", "/state", timeout=timeout)
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise AgentError("node agent returned no GPU list")
    return doc
