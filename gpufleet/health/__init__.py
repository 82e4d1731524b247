"""`gpufleet node-health`: one node checker for real clusters (DCGM / NVML / kernel log) and the
sandbox (its node agent), applying the fault catalog's policy."""

from gpufleet.health.decide import Finding, Verdict, drain_reason, evaluate
from gpufleet.health.observe import GpuReading, LinkReading, Observations, XidSeen

__all__ = ["Finding", "GpuReading", "LinkReading", "Observations", "Verdict", "XidSeen", "drain_reason",
           "evaluate"]
