"""Accelerator models and their specs: one table, looked up by a pure function (STYLE.md point 6).

Figures are per device, from the vendors' public datasheets:
- NVIDIA H100 SXM5 80GB: "NVIDIA H100 Tensor Core GPU" datasheet — BF16 1,979 TFLOPS with
  sparsity, i.e. 989 dense; NVLink 900 GB/s; 80 GB HBM3.
- NVIDIA H200 SXM 141GB: "NVIDIA H200 Tensor Core GPU" datasheet — BF16 1,979 TFLOPS sparse
  (989 dense); NVLink 900 GB/s; 141 GB HBM3e.
- NVIDIA B200 (HGX B200, 180 GB): "NVIDIA Blackwell" HGX B200 datasheet — 18 PFLOPS FP16/BF16
  sparse per 8 GPUs, i.e. 2,250 dense per GPU; NVLink 5 1.8 TB/s.
- AMD Instinct MI300X: AMD MI300X datasheet — BF16 1,307.4 TFLOPS dense; 192 GB HBM3;
  Infinity Fabric 896 GB/s aggregate peer bandwidth.
- Huawei Ascend 910B: Huawei Atlas 800T A2 datasheet — ~313 TFLOPS FP16/BF16 (910B3); 64 GB HBM2e;
  HCCS 392 GB/s (7 x 56 GB/s).
Kubernetes label values follow gpu-feature-discovery (`nvidia.com/gpu.product`, memory in MiB).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Vendor(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    HUAWEI = "huawei"


class AcceleratorModel(StrEnum):
    H100_SXM = "nvidia-h100-sxm"
    H200_SXM = "nvidia-h200-sxm"
    B200 = "nvidia-b200"
    MI300X = "amd-mi300x"
    ASCEND_910B = "huawei-ascend-910b"


@dataclass(frozen=True)
class AcceleratorSpec:
    model: AcceleratorModel
    vendor: Vendor
    memory_gib: int
    bf16_dense_tflops: float
    scale_up: str  # intra-node interconnect name
    scale_up_gbps: int  # GB/s per device, aggregate
    resource_name: str  # extended resource requested by pods
    device_plugin: str  # what installs the device plugin
    node_labels: dict[str, str]  # labels the vendor tooling puts on such a node
    max_per_node: int


_SPECS: dict[AcceleratorModel, AcceleratorSpec] = {
    AcceleratorModel.H100_SXM: AcceleratorSpec(
        AcceleratorModel.H100_SXM, Vendor.NVIDIA, 80, 989.0, "NVLink 4", 900, "nvidia.com/gpu",
        "nvidia-gpu-operator",
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
         "nvidia.com/gpu.memory": "81559", "feature.node.kubernetes.io/pci-10de.present": "true"},
        8,
    ),
    AcceleratorModel.H200_SXM: AcceleratorSpec(
        AcceleratorModel.H200_SXM, Vendor.NVIDIA, 141, 989.0, "NVLink 4", 900, "nvidia.com/gpu",
        "nvidia-gpu-operator",
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H200",
         "nvidia.com/gpu.memory": "143771", "feature.node.kubernetes.io/pci-10de.present": "true"},
        8,
    ),
    AcceleratorModel.B200: AcceleratorSpec(
        AcceleratorModel.B200, Vendor.NVIDIA, 180, 2250.0, "NVLink 5", 1800, "nvidia.com/gpu",
        "nvidia-gpu-operator",
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-B200",
         "nvidia.com/gpu.memory": "183359", "feature.node.kubernetes.io/pci-10de.present": "true"},
        8,
    ),
    AcceleratorModel.MI300X: AcceleratorSpec(
        AcceleratorModel.MI300X, Vendor.AMD, 192, 1307.4, "Infinity Fabric", 896, "amd.com/gpu",
        "amd-gpu-operator",
        {"feature.node.kubernetes.io/amd-gpu": "true"},
        8,
    ),
    AcceleratorModel.ASCEND_910B: AcceleratorSpec(
        AcceleratorModel.ASCEND_910B, Vendor.HUAWEI, 64, 313.0, "HCCS", 392, "huawei.com/Ascend910",
        "ascend-device-plugin",
        {"accelerator": "huawei-Ascend910", "accelerator-type": "module-910b-8"},
        8,
    ),
}


def accelerator_spec(model: AcceleratorModel) -> AcceleratorSpec:
    """Specs of one accelerator model."""
    return _SPECS[model]


def all_specs() -> list[AcceleratorSpec]:
    return list(_SPECS.values())
