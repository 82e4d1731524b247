"""Fake-GPU node agent of the sandbox: dcgm-exporter-format metrics for fake GPUs, node_exporter
fabric metrics read from the kernel, DCGM-style fault injection (docs/node-agent.md)."""

from gpufleet.sandbox.agent.fields import FIELDS, MODEL_NAMES, FieldSpec, gpu_uuid, pci_bus_id
from gpufleet.sandbox.agent.state import AgentState, Injection, XidEvent, clear, inject, parse_injection

__all__ = [
    "FIELDS",
    "MODEL_NAMES",
    "AgentState",
    "FieldSpec",
    "Injection",
    "XidEvent",
    "clear",
    "gpu_uuid",
    "inject",
    "parse_injection",
    "pci_bus_id",
]
