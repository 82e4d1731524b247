"""Real Prometheus (Debian's /usr/bin/prometheus) in the head namespace, reached from the root
namespace through the port forwarder, and a few read helpers over its HTTP API."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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
