"""The node agent's control socket queues a burst of connections instead of refusing them."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from gpufleet.sandbox.agent.control import _Server


def test_forty_connects_before_any_accept_all_get_through(tmp_path: Path) -> None:
    # With socketserver's backlog of 5 the 7th connect failed at once with EAGAIN ("Resource
    # temporarily unavailable"), which a reader takes for a dead agent.
    path = str(tmp_path / "agent.sock")
    server = _Server(path, BaseHTTPRequestHandler)  # never accepts in this test
    socks: list[socket.socket] = []
    try:
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1)
            s.connect(path)
            socks.append(s)
        assert len(socks) == 40
    finally:
        for s in socks:
            s.close()
        server.server_close()
