"""Shared test data for the simulator: a stack builder and a catalog of the Llama 3 table.

The Llama 3 catalog here is TEST DATA (counts from Meta's Table 5 as quoted in
shared/reference/failure-data.md); the back-test against the real catalog lives in
test_sim_validation.py.
"""

from __future__ import annotations

from typing import Any

from gpufleet.catalog import Catalog, Fault
from gpufleet.config import StackSpec

LLAMA3_GPU_HOURS = 16_384 * 54 * 24  # 21,233,664 GPU-hours (D)

# (root cause, count, class, action)
LLAMA3_ROWS: list[tuple[str, int, str, str]] = [
    ("Faulty GPU", 148, "gpu-fatal", "reboot-node"),
    ("GPU HBM3 memory", 72, "gpu-fatal", "reset-gpu"),
    ("Software bug", 54, "gpu-contained", "restart-job"),
    ("Network switch/cable", 35, "fabric-link-down", "reboot-node"),
    ("Host maintenance (unplanned)", 32, "node-maintenance", "reboot-node"),
    ("GPU SRAM memory", 19, "gpu-fatal", "reset-gpu"),
    ("GPU system processor", 17, "gpu-fatal", "reset-gpu"),
    ("NIC", 7, "fabric-link-down", "replace"),
    ("NCCL watchdog timeouts", 7, "node-hang", "restart-job"),
    ("Silent data corruption", 6, "gpu-degraded", "replace"),
    ("GPU thermal interface + sensor", 6, "gpu-degraded", "reset-gpu"),
    ("SSD", 3, "node-crash", "replace"),
    ("Power supply", 3, "node-crash", "replace"),
    ("Server chassis", 2, "node-crash", "replace"),
    ("IO expansion board", 2, "node-crash", "replace"),
    ("Dependency", 2, "node-crash", "restart-job"),
    ("CPU", 2, "node-crash", "replace"),
    ("System memory", 2, "node-crash", "replace"),
]


def fault(fid: str, cls: str, action: str, per_million: float | None, cause: str = "test cause",
          **extra: Any) -> Fault:
    data: dict[str, Any] = {
        "id": fid, "class": cls, "severity": "critical", "title": fid, "exemption": "test data",
        "action": action, **extra,
    }
    if per_million is not None:
        data["rate"] = {"perMillionGpuHours": per_million, "cause": cause, "source": "test"}
    return Fault.model_validate(data)


def llama3_catalog() -> Catalog:
    return Catalog(tuple(
        fault(f"f{i}", cls, action, count / LLAMA3_GPU_HOURS * 1e6, cause)
        for i, (cause, count, cls, action) in enumerate(LLAMA3_ROWS)
    ))


def stack(
    nodes: int = 64,
    spares: int = 4,
    gpus: int = 8,
    interval_minutes: float = 30.0,
    write_seconds: float = 30.0,
    load_seconds: float = 60.0,
    spare_mode: str = "warm",
    nodes_per_leaf: int = 32,
    detection: dict[str, str] | None = None,
    ettr: float = 0.9,
    availability: float = 0.99,
) -> StackSpec:
    return StackSpec.model_validate({
        "cluster": {"name": "t", "environment": "production"},
        "nodePools": [{
            "name": "gpu", "accelerator": "nvidia-h100-sxm", "gpusPerNode": gpus, "nodes": nodes,
            "spares": spares, "spareMode": spare_mode,
            "provisioning": {"kind": "static", "nodeNamePattern": "n-{index}"},
            "topology": {"nodesPerRack": 4, "nodesPerLeaf": nodes_per_leaf},
        }],
        "fabric": {"kind": "infiniband", "railsPerNode": 8, "nicsPerNode": 8, "linkSpeedGbps": 400,
                   "mode": "rdma-shared"},
        "storage": {"checkpoint": {"location": "/ckpt", "intervalMinutes": interval_minutes,
                                   "writeSeconds": write_seconds, "loadSeconds": load_seconds}},
        "scheduler": {"kind": "slurm", "queues": [{"name": "q"}]},
        "monitoring": {"grafana": False},
        "remediation": {"detection": detection or {}},
        "slos": {"ettr": ettr, "availability": availability},
    })

