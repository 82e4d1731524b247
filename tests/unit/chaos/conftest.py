"""Shared fixtures of the chaos unit tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos import engine


@pytest.fixture(autouse=True)
def _fresh_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test: its own ledger and a new run id."""
    monkeypatch.setenv("GPUFLEET_LEDGER", str(tmp_path / "ledger" / "faults.jsonl"))
    engine.end_runs()
    yield
    engine.end_runs()


class FakeApiServer:
    """A Kubernetes API stand-in on 127.0.0.1 that records every request exactly and answers from
    canned responses keyed by (method, path)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responses: dict[tuple[str, str], tuple[int, Any]] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                path = self.path.split("?", 1)[0]
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": path,
                        "query": self.path.partition("?")[2],
                        "content_type": self.headers.get("Content-Type"),
                        "body": json.loads(raw) if raw else None,
                    }
                )
                status, body = outer.responses.get(
                    (self.command, path), (404, {"kind": "Status", "code": 404})
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    s = FakeApiServer()
    yield s
    engine.end_runs()  # stop the scheduler watcher before its server goes away
    s.close()
