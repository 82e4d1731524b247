"""The DCGM fields the fake GPUs publish: field id -> dcgm-exporter metric name, type and baseline.

Field ids are DCGM's (dcgm_fields.h, listed in shared/reference/gpu-faults.md); metric names are
dcgm-exporter's (`DCGM_FI_DEV_<field>`), types as in dcgm-exporter's default-counters.csv.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from gpufleet.config.accelerators import AcceleratorModel

MetricKind = Literal["gauge", "counter"]

# DCGM field ids (gpu-faults.md "DCGM").
XID_ERRORS = 230
GPU_TEMP = 150
POWER_USAGE = 155
GPU_UTIL = 203
PCIE_REPLAY_COUNTER = 202
POWER_VIOLATION = 240
THERMAL_VIOLATION = 241
ECC_SBE_VOL_TOTAL = 310
ECC_DBE_VOL_TOTAL = 311
ECC_DBE_AGG_TOTAL = 313
UNCORRECTABLE_REMAPPED_ROWS = 393
CORRECTABLE_REMAPPED_ROWS = 394
ROW_REMAP_FAILURE = 395
ROW_REMAP_PENDING = 396
NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 409
NVLINK_REPLAY_ERROR_COUNT_TOTAL = 429
NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 439


@dataclass(frozen=True)
class FieldSpec:
    field_id: int
    metric: str  # dcgm-exporter metric name
    kind: MetricKind  # type dcgm-exporter declares
    help: str
    idle: float  # value of a healthy idle GPU
    busy: float  # value of a healthy GPU running a training rank


FIELDS: dict[int, FieldSpec] = {
    f.field_id: f
    for f in (
        FieldSpec(XID_ERRORS, "DCGM_FI_DEV_XID_ERRORS", "gauge",
                  "Value of the last XID error encountered.", 0, 0),
        # H100 SXM idles around 30-40 C / 70-120 W and runs 60-70 C / 500-700 W under load (TDP 700 W).
        FieldSpec(GPU_TEMP, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 34, 63),
        FieldSpec(POWER_USAGE, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 72.5, 610.0),
        FieldSpec(GPU_UTIL, "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 0, 97),
        FieldSpec(PCIE_REPLAY_COUNTER, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter",
                  "Total number of PCIe retries.", 0, 0),
        FieldSpec(POWER_VIOLATION, "DCGM_FI_DEV_POWER_VIOLATION", "counter",
                  "Throttling duration due to power constraints (in us).", 0, 0),
        FieldSpec(THERMAL_VIOLATION, "DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
                  "Throttling duration due to thermal constraints (in us).", 0, 0),
        FieldSpec(ECC_SBE_VOL_TOTAL, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
                  "Total number of single-bit volatile ECC errors.", 0, 0),
        FieldSpec(ECC_DBE_VOL_TOTAL, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
                  "Total number of double-bit volatile ECC errors.", 0, 0),
        FieldSpec(ECC_DBE_AGG_TOTAL, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
                  "Total number of double-bit persistent ECC errors.", 0, 0),
        FieldSpec(UNCORRECTABLE_REMAPPED_ROWS, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
                  "Number of remapped rows for uncorrectable errors.", 0, 0),
        FieldSpec(CORRECTABLE_REMAPPED_ROWS, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
                  "Number of remapped rows for correctable errors.", 0, 0),
        FieldSpec(ROW_REMAP_FAILURE, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge",
                  "Whether remapping of rows has failed.", 0, 0),
        FieldSpec(ROW_REMAP_PENDING, "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge",
                  "Whether remapping of rows is pending (GPU reset needed).", 0, 0),
        FieldSpec(NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                  "counter", "Total number of NVLink flow-control CRC errors.", 0, 0),
        FieldSpec(NVLINK_REPLAY_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                  "counter", "Total number of NVLink retries.", 0, 0),
        FieldSpec(NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                  "counter", "Total number of NVLink recovery errors.", 0, 0),
    )
}

XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"

# modelName label as dcgm-exporter reports it (NVML device name). Only NVIDIA models have DCGM.
MODEL_NAMES: dict[AcceleratorModel, str] = {
    AcceleratorModel.H100_SXM: "NVIDIA H100 80GB HBM3",
    AcceleratorModel.H200_SXM: "NVIDIA H200",
    AcceleratorModel.B200: "NVIDIA B200",
}

# PCI bus numbers of the 8 GPUs of an HGX H100 board (DGX H100 layout); more GPUs continue upwards.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def pci_bus_id(gpu: int) -> str:
    """Short PCI address as the NVIDIA driver prints it in `NVRM: Xid (PCI:0000:18:00)` lines."""
    bus = _PCI_BUSES[gpu] if gpu < len(_PCI_BUSES) else 0xE0 + gpu
    return f"0000:{bus:02x}:00"


def gpu_uuid(node: str, gpu: int) -> str:
    """A stable GPU UUID in NVML's format (GPU-8-4-4-4-12 hex), derived from node and index."""
    h = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def field_spec(field_id: int) -> FieldSpec:
    try:
        return FIELDS[field_id]
    except KeyError:
        known = ", ".join(str(k) for k in sorted(FIELDS))
        raise ValueError(f"field {field_id} is not published by this agent; known fields: {known}") from None
