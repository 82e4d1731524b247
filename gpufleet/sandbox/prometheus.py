"""Real Prometheus (Debian's /usr/bin/prometheus) in the head namespace, reached from the root
namespace through the port forwarder, and a few read helpers over its HTTP API."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx

import gpufleet
from gpufleet.sandbox import configs
from gpufleet.sandbox.layout import PROMETHEUS_PORT, Layout
from gpufleet.sandbox.processes import Started, spawn

RULES_RELATIVE = Path("monitoring/rules/gpufleet.rules.yaml")


def repo_rule_file() -> Path:
    """The rule file generated from the catalog (the same one the Pulumi stack deploys)."""
    return Path(gpufleet.__file__).resolve().parents[1] / RULES_RELATIVE


def write_config(layout: Layout, rule_files: list[Path]) -> Path:
    d = layout.path("prometheus")
    layout.file_sd_dir.mkdir(parents=True, exist_ok=True)
    (d / "data").mkdir(parents=True, exist_ok=True)
    path = d / "prometheus.yml"
    path.write_text(configs.prometheus_yaml(layout, rule_files))
    return path


def start(layout: Layout, config: Path, retention: str) -> Started:
    d = layout.path("prometheus")
    argv = [
        "prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={d / 'data'}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]
    return spawn("prometheus", argv, d / "prometheus.log", netns=layout.head.netns)


def start_forwarder(layout: Layout) -> tuple[Started, Path]:
    port_file = layout.path("prometheus", "forward.port")
    argv = [
        sys.executable,
        "-m",
        "gpufleet.sandbox.portforward",
        "--netns",
        layout.head.netns,
        "--target-port",
        str(PROMETHEUS_PORT),
        "--port-file",
        str(port_file),
    ]
    return spawn("portforward@prometheus", argv, layout.path("prometheus", "forward.log")), port_file


def read_port(port_file: Path, deadline: float) -> int | None:
    while time.monotonic() < deadline:
        try:
            return int(port_file.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


class PrometheusClient:
    """The few API calls the sandbox and its tests need (Prometheus HTTP API v1)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def ready(self) -> bool:
        try:
            return self._http.get(f"{self.url}/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        r = self._http.get(f"{self.url}{path}", params=params)
        r.raise_for_status()
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        data = self._get("/api/v1/targets", {"state": "active"})
        return list(data["activeTargets"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/query", {"query": expr})["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules")["groups"])
