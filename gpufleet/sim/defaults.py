"""Default handling times of the simulator, each with the source behind the number.

Rates are NOT here: they come from the fault catalog (gpufleet/catalog/data, `rate:` of each fault).
What is here is how long detecting, isolating, restarting and repairing take when neither the stack,
a scenario file nor a game-day report says otherwise. Tags as in shared/reference/failure-data.md:
P = paper, A = abstract, S = secondary summary, D = our arithmetic; "assumed" marks a modelling
choice with no published figure behind it (override it in a scenario).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.core.taxonomy import FaultClass


@dataclass(frozen=True)
class Sourced:
    value: float
    source: str


_BYTEROBUST = "ByteRobust (SOSP 2025), active inspection (S)"

# Detection with active monitoring, per class (ByteRobust's per-symptom figures, mapped to our
# classes). Without it a job only notices a dead peer when the collective times out.
ACTIVE_DETECT_SECONDS: dict[FaultClass, Sourced] = {
    FaultClass.GPU_FATAL: Sourced(10.0, f"{_BYTEROBUST}: GPU lost 10 s"),
    FaultClass.GPU_CONTAINED: Sourced(10.0, f"{_BYTEROBUST}: driver hang 10 s"),
    FaultClass.GPU_DEGRADED: Sourced(10.0, f"{_BYTEROBUST}: driver hang 10 s (assumed same)"),
    FaultClass.NODE_CRASH: Sourced(2.0, f"{_BYTEROBUST}: OS kernel fault 2 s"),
    FaultClass.NODE_HANG: Sourced(10.0, f"{_BYTEROBUST}: driver hang 10 s (assumed same)"),
    FaultClass.NODE_MAINTENANCE: Sourced(2.0, f"{_BYTEROBUST}: OS kernel fault 2 s (assumed same)"),
    FaultClass.FABRIC_LINK_DOWN: Sourced(30.0, f"{_BYTEROBUST}: NIC crash 30 s"),
    FaultClass.FABRIC_FLAP: Sourced(30.0, f"{_BYTEROBUST}: port flapping 30 s"),
    FaultClass.FABRIC_DEGRADED: Sourced(30.0, f"{_BYTEROBUST}: port flapping 30 s (assumed same)"),
    FaultClass.FABRIC_SWITCH_DOWN: Sourced(60.0, f"{_BYTEROBUST}: switch down 60 s"),
    FaultClass.STORAGE_OUTAGE: Sourced(60.0, "assumed (no published figure; switch-down order)"),
    FaultClass.STORAGE_DEGRADED: Sourced(60.0, "assumed (no published figure; switch-down order)"),
    FaultClass.WORKLOAD: Sourced(2.0, "assumed (the job's own exit is seen at once, as an OS fault 2 s)"),
}

# Passive detection: the surviving ranks wait for the collective watchdog.
COLLECTIVE_TIMEOUT = Sourced(
    600.0, "NCCL watchdog default ~10 min; ByteRobust (S) '~10 min when waiting for the NCCL timeout'"
)

# Cordon + drain of the failed node once detected (NVSentinel flow: quarantine -> drain).
ISOLATE_SECONDS = Sourced(60.0, "assumed (cordon + drain; game-day reports replace it)")

# Restart cost grows with job size: Meta FT-HSDP cold restart ~200 s at 16K GPUs, ~900 s at 98K (S).
# A power law through both points: 900/200 = (98,304/16,384)^b  =>  b = ln 4.5 / ln 6 = 0.839 (D).
RESTART_REF_GPUS = 16_384
RESTART_REF_SECONDS = Sourced(200.0, "Meta FT-HSDP (S): cold restart ~200 s at 16K GPUs")
RESTART_EXPONENT = Sourced(
    0.839, "D: power law through Meta FT-HSDP (S) ~200 s at 16K GPUs and ~900 s at 98K GPUs"
)

# Ladder rungs that take the node out but bring it back quickly.
RESET_GPU_SECONDS = Sourced(300.0, "assumed (drain + nvidia-smi -r + health check)")
REBOOT_NODE_SECONDS = Sourced(1200.0, "assumed (drain + power-cycle + boot + health check)")

# A cold spare must be powered, booted and health-checked before it joins.
COLD_START_SECONDS = Sourced(
    1200.0, "assumed (boot + health check); ByteRobust (S): warm standby up to 10.87x faster than requeue"
)

# A human handles what the remediator refuses to do while the circuit breaker is open.
MANUAL_SECONDS = Sourced(3600.0, "assumed (page + manual triage)")

# How long a correlated (domain) outage lasts: a leaf switch keeps its nodes out, a storage outage
# stops the job (no checkpoint to load or write).
DOMAIN_OUTAGE_HOURS: dict[FaultClass, Sourced] = {
    FaultClass.FABRIC_SWITCH_DOWN: Sourced(4.0, "assumed (leaf switch swap)"),
    FaultClass.STORAGE_OUTAGE: Sourced(1.0, "assumed (storage failover / restart)"),
    FaultClass.STORAGE_DEGRADED: Sourced(1.0, "assumed (a degraded placement group recovers)"),
}
DOMAIN_OUTAGE_FALLBACK = Sourced(4.0, "assumed")

# Node repair after `replace`: Microsoft SuperBench fleet (S): 62% fixed the same day, 38% take
# > 1 day, 10% > 2 weeks. Bins (share, min h, max h), log-uniform inside a bin; the bin edges
# beyond the published splits (1 h floor, 6-week ceiling) are assumed.
REPAIR_BINS: tuple[tuple[float, float, float], ...] = (
    (0.62, 1.0, 24.0),
    (0.28, 24.0, 336.0),
    (0.10, 336.0, 1008.0),
)
REPAIR_SOURCE = (
    "Microsoft SuperBench fleet (S): 62% same day, 38% > 1 day, 10% > 2 weeks; "
    "log-uniform within bins, 1 h floor and 6-week ceiling assumed"
)

# Nodes that failed before fail sooner: mean time between incidents 719 h -> 152 h by the 20th
# (SuperBench, S): (719/152)^(1/19) = 1.085 per incident (D). Off by default (1.0): it raises the
# fleet's rate above the catalog's published one; scenarios turn it on.
RECURRENCE_FACTOR_SUPERBENCH = 1.085
RECURRENCE_CAP = 20

DEFAULT_DOMAINS: dict[FaultClass, str] = {
    FaultClass.FABRIC_SWITCH_DOWN: "leaf",
    FaultClass.STORAGE_OUTAGE: "cluster",
    FaultClass.STORAGE_DEGRADED: "cluster",
}

# The checkpoint store is one system for the whole job: its faults do not multiply with our node
# count. The catalog's storage rates are Llama 3's "Dependency" count over its GPU-hours, seen by
# one job on 16,384 GPUs, so the store's events per hour = per-GPU-hour rate x 16,384 (D).
STORE_REFERENCE_GPUS = Sourced(
    16_384.0, "Llama 3 Herd of Models (Meta, 2024): the store's faults were seen by one 16,384-GPU job (D)")
# How much slower saves and loads are while the store is degraded.
STORE_DEGRADED_FACTOR = Sourced(5.0, "assumed (no published figure)")
# A save that fails on its own (the store is up): off unless a scenario says otherwise.
CHECKPOINT_FAILURE_PROBABILITY = Sourced(0.0, "assumed (no published figure): off")

# Ladder rung for a class that a scenario adds a rate for but the catalog has no entry of
# (assumed, following gpu-faults.md's ladder: restart app -> reset GPU -> reboot node -> replace).
CLASS_DEFAULT_ACTION: dict[FaultClass, str] = {
    FaultClass.GPU_FATAL: "reboot-node",
    FaultClass.GPU_CONTAINED: "restart-job",
    FaultClass.GPU_DEGRADED: "reset-gpu",
    FaultClass.NODE_CRASH: "reboot-node",
    FaultClass.NODE_HANG: "reboot-node",
    FaultClass.NODE_MAINTENANCE: "reboot-node",
    FaultClass.FABRIC_LINK_DOWN: "reboot-node",
    FaultClass.FABRIC_FLAP: "restart-job",
    FaultClass.FABRIC_DEGRADED: "restart-job",
    FaultClass.FABRIC_SWITCH_DOWN: "none",
    FaultClass.STORAGE_OUTAGE: "none",
    FaultClass.STORAGE_DEGRADED: "restart-job",
    FaultClass.WORKLOAD: "restart-job",
}
