"""The exporter formats of the other vendors' accelerators, as the node agent publishes them: AMD's
device-metrics-exporter for MI300X, Huawei's npu-exporter for Ascend 910B (NVIDIA's is
dcgm-exporter's, fields.py). Names, labels and polarities are the exporters' own, as
gpufleet/catalog/exporters.yaml records them with their sources; the idle and busy values are ours.

Each vendor's GPU series are gauges keyed by name (neither exporter has DCGM's field ids): an
`exporter-inject` sets one, read from then on as a DCGM injection is, until the GPU is reset.
Ascend's link and network status are the NPU's own RoCE port: here they follow the node's fabric
link of the NPU's rail (0 while it is down), so a link-down on an Ascend node reads as it does there;
the network status can also be set alone (its detect address unreachable over a live link).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.config.accelerators import AcceleratorModel, Vendor, accelerator_spec


@dataclass(frozen=True)
class VendorSeries:
    name: str
    help: str
    idle: float  # a healthy idle GPU
    busy: float  # a healthy GPU running a training rank
    follows_link: bool = False  # 0 while the GPU's fabric link is down (Ascend's own RoCE port)
    injectable: bool = True  # False: only the state it reports can change it (take the link down)


@dataclass(frozen=True)
class VendorFormat:
    vendor: Vendor
    exporter: str  # its name in exporters.yaml
    labels: tuple[str, ...]
    label_values: Callable[[str, int, str], tuple[str, ...]]  # (node, gpu, model label) -> values
    model_label: str  # the value the exporter puts in its model label
    series: dict[str, VendorSeries]

    def spec(self, metric: str) -> VendorSeries:
        try:
            return self.series[metric]
        except KeyError:
            known = ", ".join(sorted(self.series))
            raise ValueError(
                f"metric {metric!r} is not published by {self.exporter}; known: {known}") from None


def _hex(node: str, gpu: int, n: int) -> str:
    return hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()[:n]


def _amd_labels(node: str, gpu: int, model: str) -> tuple[str, ...]:
    # gpu_id, serial_number, card_model, hostname, gpu_partition_id, gpu_compute_partition_type
    # (an MI300X undivided: partition 0 of compute mode SPX).
    return (str(gpu), _hex(node, gpu, 16).upper(), model, node, "0", "spx")


def _npu_labels(node: str, gpu: int, model: str) -> tuple[str, ...]:
    # id, model_name, vdie_id, pcie_bus_info, namespace, pod_name, container_name (the last three
    # empty: npu-exporter fills them only for an NPU allocated to a pod).
    return (str(gpu), model, _hex(node, gpu, 32).upper(), f"0000:{0xC1 + gpu:02X}:00.0", "", "", "")


AMD = VendorFormat(
    vendor=Vendor.AMD,
    exporter="amd-device-metrics-exporter",
    labels=("gpu_id", "serial_number", "card_model", "hostname", "gpu_partition_id",
            "gpu_compute_partition_type"),
    label_values=_amd_labels,
    model_label="MI300X",
    series={s.name: s for s in (
        VendorSeries("gpu_health", "1 healthy, 0 unhealthy.", 1, 1),
        VendorSeries("gpu_ecc_uncorrect_total", "Uncorrectable ECC errors since the driver loaded.", 0, 0),
        VendorSeries("gpu_ecc_correct_total", "Correctable ECC errors since the driver loaded.", 0, 0),
        VendorSeries("pcie_replay_count", "PCIe replays.", 0, 0),
        # MI300X: junction ~40 C idle, ~80 C under load (our figures, below its 105 C limit).
        VendorSeries("gpu_junction_temperature", "Junction temperature (C).", 40, 78),
    )},
)

NPU = VendorFormat(
    vendor=Vendor.HUAWEI,
    exporter="npu-exporter",
    labels=("id", "model_name", "vdie_id", "pcie_bus_info", "namespace", "pod_name", "container_name"),
    label_values=_npu_labels,
    model_label="Ascend910B",
    series={s.name: s for s in (
        VendorSeries("npu_chip_info_health_status", "1 healthy, 0 unhealthy, -1 unreadable.", 1, 1),
        VendorSeries("npu_chip_info_error_code", "The first error code of the chip (0: none).", 0, 0),
        VendorSeries("npu_chip_info_hbm_ecc_double_bit_error_cnt", "HBM double-bit ECC errors.", 0, 0),
        VendorSeries("npu_chip_info_link_status", "The NPU's RoCE port: 1 UP, 0 DOWN.", 1, 1,
                     follows_link=True, injectable=False),
        VendorSeries("npu_chip_info_network_status", "The NPU's network health: 1 healthy, 0 unhealthy.",
                     1, 1, follows_link=True),
        VendorSeries("npu_chip_info_temperature", "NPU temperature (C).", 38, 62),
    )},
)

_BY_VENDOR = {Vendor.AMD: AMD, Vendor.HUAWEI: NPU}


def vendor_format(model: AcceleratorModel) -> VendorFormat | None:
    """The exporter format of `model`'s vendor; None for NVIDIA (dcgm-exporter's, fields.py)."""
    return _BY_VENDOR.get(accelerator_spec(model).vendor)
