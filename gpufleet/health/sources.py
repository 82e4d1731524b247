"""Thin I/O wrappers that gather Observations: the sandbox node agent, DCGM (`dcgmi`), NVML
(`nvidia-smi`), the kernel log, /sys link state and the checkpoint mount. Every failure becomes an
`unknown` reason, never an empty (healthy-looking) reading."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from gpufleet.core import agent_client as _agent
from gpufleet.core.host import HostReadError, run_tool
from gpufleet.core.host.kernel_log import read_dmesg as read_dmesg
from gpufleet.core.host.kernel_log import read_kernel_log as read_kernel_log
from gpufleet.core.host.links import read_ib_ports as read_ib_ports
from gpufleet.core.host.links import read_net_links as read_net_links
from gpufleet.core.host.nvidia_smi import query_gpus
from gpufleet.health.observe import GpuReading, XidSeen, gpu_readings, normalize_pci, parse_dcgmi_dmon

# One error for every source: the host readers' (gpufleet.core.host) and this module's.
SourceError = HostReadError


def stat_latency(path: Path, timeout: float) -> float:
    """Seconds a stat() of the mount takes; `timeout + 1` when it hangs past the timeout (a hung
    network filesystem blocks stat() in the kernel: it is left behind in a daemon thread)."""
    done = threading.Event()
    err: list[OSError] = []

    def run() -> None:
        try:
            os.stat(path)
        except OSError as e:
            err.append(e)
        done.set()

    t0 = time.monotonic()
    threading.Thread(target=run, daemon=True).start()
    if not done.wait(timeout):
        return timeout + 1.0
    if err:
        raise SourceError(f"checkpoint mount {path}: {err[0].strerror}")
    return time.monotonic() - t0


# --------------------------------------------------------------------------- sandbox agent


def agent_state(socket_path: Path, token: str, timeout: float = 3.0) -> dict[str, Any]:
    try:
        return _agent.agent_state(socket_path, token, timeout)
    except _agent.AgentError as e:
        raise SourceError(str(e)) from None


def agent_readings(doc: dict[str, Any]) -> tuple[list[GpuReading], dict[str, int], list[XidSeen]]:
    gpus, pci = [], {}
    for g in doc["gpus"]:
        idx = int(g["index"])
        gpus.append(GpuReading(idx, {int(k): float(v) for k, v in g.get("fields", {}).items()},
                               {str(k): float(v) for k, v in g.get("metrics", {}).items()},
                               g.get("reset_at")))
        if g.get("pci_bus_id"):
            pci[normalize_pci(str(g["pci_bus_id"]))] = idx
    events = [XidSeen(int(e["gpu"]), int(e["xid"]), float(e["at"])) for e in doc.get("events", [])]
    return gpus, pci, events


# --------------------------------------------------------------------------- real GPUs

# The label that numbers the GPUs in each vendor exporter's series (exporters.yaml):
# device-metrics-exporter's gpu_id, npu-exporter's id.
GPU_INDEX_LABELS = ("gpu_id", "id")


def parse_exporter(text: str) -> list[GpuReading]:
    """Per-GPU series of an AMD or Ascend exporter's /metrics text: every sample that carries a GPU
    index label, by index (a series the catalog does not read is kept and ignored)."""
    from prometheus_client.parser import text_string_to_metric_families

    by_gpu: dict[int, dict[str, float]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                label = next((k for k in GPU_INDEX_LABELS if k in sample.labels), None)
                if label is None:
                    continue
                try:
                    idx = int(sample.labels[label])
                except ValueError:
                    continue
                by_gpu.setdefault(idx, {})[sample.name] = float(sample.value)
    except ValueError as e:
        raise SourceError(f"exporter text unreadable: {e}") from None
    return [GpuReading(i, metrics=m) for i, m in sorted(by_gpu.items())]


def read_exporter(url: str, timeout: float = 5.0) -> list[GpuReading]:
    import httpx

    try:
        r = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as e:
        raise SourceError(f"exporter {url}: {e}") from None
    if r.status_code != 200:
        raise SourceError(f"exporter {url} answered HTTP {r.status_code}")
    gpus = parse_exporter(r.text)
    if not gpus:
        raise SourceError(f"exporter {url} publishes no per-GPU series ({'/'.join(GPU_INDEX_LABELS)} label)")
    return gpus


DMON_FIELDS = (230, 310, 311, 393, 394, 395, 396, 150, 409)


def read_dcgm() -> list[GpuReading]:
    text = run_tool(["dcgmi", "dmon", "-e", ",".join(map(str, DMON_FIELDS)), "-c", "1"])
    readings = parse_dcgmi_dmon(text, DMON_FIELDS)
    if not readings:
        raise SourceError(f"dcgmi dmon listed no GPU: {text.strip()[:200]!r}")
    return readings


def read_nvml() -> tuple[list[GpuReading], dict[str, int]]:
    return gpu_readings(query_gpus())


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise SourceError(f"token file {path}: {e.strerror}") from None
    if not token:
        raise SourceError(f"token file {path} is empty")
    return token


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())
