"""Stable failure codes of `gpufleet inspect`, each mapped to the catalog fault (and so the alert
and runbook) an operator follows. A consistency test holds every code to a fault that exists.

Codes are never renumbered or reused: a retired check keeps its number out of use.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    FAIL = "fail"  # the node is unhealthy: drain (Slurm) / condition True (node-problem-detector)
    WARN = "warn"  # reported and trended, the node stays in service


@dataclass(frozen=True)
class CodeSpec:
    code: str
    name: str
    severity: Severity
    fault_id: str | None  # None: the fault comes from the finding (XIDs: the catalog's fault for the XID)
    why: str  # why this fault: the reasoning behind the mapping


_SPECS = (
    CodeSpec("GFI001", "gpu-count-low", Severity.FAIL, "gpu-missing",
             "fewer GPUs than the pool's gpusPerNode: a GPU fell off the bus or the driver lost it"),
    CodeSpec("GFI002", "gpu-xid", Severity.FAIL, None,
             "an XID since the GPU's last reset whose catalog action isolates the node (fault by XID)"),
    CodeSpec("GFI003", "gpu-xid-contained", Severity.WARN, None,
             "an XID since the last reset whose catalog action keeps the node in service"),
    CodeSpec("GFI004", "gpu-unhealthy", Severity.FAIL, None,
             "the GPU's health source (DCGM's health watches; the sandbox's agent) holds a catalog fault "
             "whose action isolates the node (fault as reported)"),
    CodeSpec("GFI005", "gpu-degraded", Severity.WARN, None,
             "the GPU's health source holds a catalog fault whose action keeps the node in service"),
    CodeSpec("GFI010", "ecc-row-remap-pending", Severity.FAIL, "gpu-row-remap-pending",
             "a row remap waits for a GPU reset"),
    CodeSpec("GFI011", "ecc-row-remap-failed", Severity.FAIL, "gpu-xid-64",
             "row remapping failed: XID 64's fault (row-remap failure)"),
    CodeSpec("GFI012", "ecc-remapped-rows-high", Severity.FAIL, "gpu-xid-64",
             "uncorrectable remapped rows above the threshold: the remap banks are nearly spent, "
             "the next remap fails (XID 64)"),
    CodeSpec("GFI013", "ecc-uncorrectable", Severity.FAIL, "gpu-xid-48",
             "uncorrectable (double-bit) volatile ECC errors: XID 48's fault"),
    CodeSpec("GFI014", "ecc-correctable-high", Severity.WARN, "gpu-xid-92",
             "correctable (single-bit) volatile ECC count above the threshold: XID 92's fault "
             "(high single-bit ECC error rate)"),
    CodeSpec("GFI020", "pcie-width-low", Severity.FAIL, "gpu-pcie-replay",
             "the GPU's PCIe link trained below its width: the link or riser is failing, the fault "
             "whose runbook covers PCIe links"),
    CodeSpec("GFI021", "pcie-gen-low", Severity.FAIL, "gpu-pcie-replay",
             "the GPU's PCIe link trained below its generation (same fault as GFI020)"),
    CodeSpec("GFI030", "fabric-port-down", Severity.FAIL, "fabric-port-down", "a fabric port is not up"),
    CodeSpec("GFI031", "fabric-port-missing", Severity.FAIL, "fabric-nic-failure",
             "a fabric port the stack declares does not exist on the node (NIC gone)"),
    CodeSpec("GFI032", "fabric-port-slow", Severity.FAIL, "fabric-link-degraded",
             "a fabric port negotiated less than the stack's link speed"),
    CodeSpec("GFI033", "fabric-port-flapping", Severity.FAIL, "fabric-link-flap",
             "a fabric port lost carrier more often than the threshold since the last sweep"),
    CodeSpec("GFI040", "driver-drift", Severity.WARN, "node-software-drift",
             "the node's GPU driver differs from the stack's pin"),
    CodeSpec("GFI041", "firmware-drift", Severity.WARN, "node-software-drift",
             "the node's GPU firmware differs from the stack's pin"),
    CodeSpec("GFI050", "perf-collective-low", Severity.FAIL, "fabric-link-degraded",
             "collective bus bandwidth below the floor: a slow link slows every collective"),
    CodeSpec("GFI051", "perf-host-copy-low", Severity.FAIL, "gpu-pcie-replay",
             "host-device copy bandwidth below the floor: the GPU's PCIe path is degraded"),
    CodeSpec("GFI052", "perf-fabric-low", Severity.FAIL, "fabric-link-degraded",
             "fabric (point-to-point) bandwidth below the floor"),
)

CODES: dict[str, CodeSpec] = {c.code: c for c in _SPECS}
BY_NAME: dict[str, CodeSpec] = {c.name: c for c in _SPECS}

# Performance metrics -> the code a result under the floor carries. A metric not listed here is
# rejected at the edge (observation sources name only these).
PERF_METRIC_CODES: dict[str, str] = {
    "nccl_allreduce_busbw_gbs": "GFI050",
    "rccl_allreduce_busbw_gbs": "GFI050",
    "h2d_gbs": "GFI051",
    "d2h_gbs": "GFI051",
    "p2p_read_gbs": "GFI050",
    "ib_write_bw_gbps": "GFI052",
    # The sandbox's measured TCP bandwidth between node namespaces over the fabric veths (sandbox.py).
    "fabric_tcp_mbps": "GFI052",
    # all_reduce bus bandwidth over gloo on the CPU (collprobe.py): the Kubernetes sandbox's
    # performance pod on a kubelet node, which has no GPU.
    "gloo_allreduce_busbw_gbs": "GFI050",
}


def spec(name: str) -> CodeSpec:
    return BY_NAME[name]
