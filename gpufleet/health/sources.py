"""Thin I/O wrappers that gather Observations: the sandbox node agent, DCGM (`dcgmi`), NVML
(`nvidia-smi`), the kernel log, /sys link state and the checkpoint mount. Every failure becomes an
`unknown` reason, never an empty (healthy-looking) reading."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.core import agent_client as _agent
from gpufleet.health.observe import (
    NVSMI_QUERY,
    GpuReading,
    LinkReading,
    XidSeen,
    normalize_pci,
    parse_dcgmi_dmon,
    parse_kernel_log,
    parse_nvidia_smi,
)

SYS_CLASS_NET = Path("/sys/class/net")
SYS_CLASS_IB = Path("/sys/class/infiniband")
KERNEL_LOG_TAIL = 4 * 1024 * 1024  # bytes of kern.log read (bounded time and memory)
CMD_TIMEOUT_S = 10.0


class SourceError(Exception):
    """A source could not be read; the message says why (it becomes an UNKNOWN reason)."""


def read_kernel_log(path: Path, pci_to_gpu: dict[str, int], now: float) -> list[XidSeen]:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - KERNEL_LOG_TAIL))
            data = fh.read().decode("utf-8", "replace")
    except OSError as e:
        raise SourceError(f"kernel log {path}: {e.strerror}") from None
    return parse_kernel_log(data.splitlines(), pci_to_gpu, now)


def read_dmesg(pci_to_gpu: dict[str, int], now: float) -> list[XidSeen]:
    """The kernel ring buffer since boot (so a reboot clears old XIDs, as on a real node)."""
    dmesg = shutil.which("dmesg") or "/usr/bin/dmesg"
    try:
        res = subprocess.run([dmesg, "--time-format", "iso"], capture_output=True, text=True,
                             timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"dmesg: {e}") from None
    if res.returncode != 0:
        raise SourceError(f"dmesg failed: {res.stderr.strip() or res.returncode}")
    return parse_kernel_log(res.stdout.splitlines(), pci_to_gpu, now)


def read_links_sysfs(ifnames: Sequence[str], root: Path = SYS_CLASS_NET) -> list[LinkReading]:
    """Interface state in THIS process's view of /sys (under `ip netns exec`, the namespace's)."""
    out = []
    for n in ifnames:
        try:
            state = (root / n / "operstate").read_text().strip()
        except OSError:
            state = "absent"  # a missing port is a down port
        out.append(LinkReading(n, state == "up", state))
    return out


def read_links_infiniband(root: Path = SYS_CLASS_IB) -> list[LinkReading]:
    """HCA ports: /sys/class/infiniband/<hca>/ports/<n>/state reads `4: ACTIVE` when up."""
    out = []
    for port in sorted(root.glob("*/ports/*")):
        try:
            state = (port / "state").read_text().strip()
        except OSError:
            continue
        out.append(LinkReading(f"{port.parent.parent.name}/{port.name}", state.startswith("4"), state))
    return out


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
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        raise SourceError("dcgmi not found")
    try:
        res = subprocess.run([dcgmi, "dmon", "-e", ",".join(map(str, DMON_FIELDS)), "-c", "1"],
                             capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"dcgmi dmon: {e}") from None
    readings = parse_dcgmi_dmon(res.stdout, DMON_FIELDS)
    if res.returncode != 0 or not readings:
        raise SourceError(f"dcgmi dmon failed: {(res.stderr or res.stdout).strip()[:200]}")
    return readings


def read_nvml() -> tuple[list[GpuReading], dict[str, int]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise SourceError("nvidia-smi not found")
    try:
        res = subprocess.run([smi, f"--query-gpu={','.join(NVSMI_QUERY)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"nvidia-smi: {e}") from None
    gpus, pci = parse_nvidia_smi(res.stdout)
    if res.returncode != 0 or not gpus:
        raise SourceError(f"nvidia-smi failed: {(res.stderr or res.stdout).strip()[:200]}")
    return gpus, pci


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
