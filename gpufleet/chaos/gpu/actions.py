"""GPU fault actions. Which faults exist, and how each is injected, comes from the fault catalog."""

from __future__ import annotations

from typing import Any

from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine

__all__ = ["clear_gpu_faults", "inject_gpu_fault"]


# The ledger kinds of GPU faults: DCGM fields (NVIDIA), the other vendors' exporter series, a hang.
GPU_INJECTIONS = frozenset({"dcgm-inject", "exporter-inject", "gpu-hang"})


def inject_gpu_fault(
    fault_id: str,
    node: str,
    gpu: int = 0,
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Inject the catalog GPU fault `fault_id` (e.g. `gpu-xid-79`, `amd-gpu-unhealthy`) on one GPU of
    `node`, the way the catalog's injection entry for the configured backend says: a DCGM field
    injection (`dcgmi test --inject` semantics) and, where the entry says `kmsg`, an `NVRM: Xid`
    kernel-log line; on an AMD or Ascend node, a value of its vendor exporter's series. Written to
    the fault ledger first; undone by `clear_gpu_faults` (rollback: GPU clear and `scontrol update
    state=resume` on the sandbox, value 0 injected on Slurm/Kubernetes).
    Faults of isolating classes count against the blast-radius limit."""
    return engine.inject_catalog_fault(configuration, fault_id, node, gpu, allow_spare_exhaustion)


def clear_gpu_faults(
    node: str | None = None, configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Undo every GPU fault still in the ledger (on `node` only, if given): clears the injected
    fields (a GPU reset) and returns a drained node to service."""
    return engine.revert_summary(engine.revert(configuration, GPU_INJECTIONS, node))
