"""The theoretical recovery floor set by configured intervals (pure).

The floor is the time a fault class would take if every component acted as soon as its
configuration allows: fixed waits (an alert's `for:`, Slurm timeouts, the resubmit delay, checkpoint
load, the process-group timeout) count in full, and every polling period (scrape, rule evaluation,
health check, Slurm ping, scheduler pass) counts half — the mean delay until the next poll for a
fault that lands at a uniformly random moment. A measured time divided by its floor says how much
of a recovery is overhead the configuration does not explain. The formula per class is in
docs/slo.md; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.core.taxonomy import FaultClass


@dataclass(frozen=True)
class Intervals:
    """Configured intervals (seconds) that bound detection and recovery. None = path absent."""

    scrape_seconds: float  # Prometheus scrape interval of the fault's metric
    evaluation_seconds: float  # Prometheus rule evaluation interval
    rule_for_seconds: float | None  # the fault's alert `for:`; None = no alert for it
    health_check_seconds: float | None  # node health-check period; None = no health check
    slurmd_timeout_seconds: float | None = None  # Slurm SlurmdTimeout; None = not a Slurm cluster
    message_timeout_seconds: float = 0.0  # Slurm MessageTimeout
    # Wait before the next incarnation is submitted: the auto-resume controller's delay after a
    # failed job (one health-check period + 1 s; 0 after NODE_FAIL), or cred_expire for a job that
    # Slurm requeues (sandbox-notes.md pitfall 4).
    resubmit_delay_seconds: float = 0.0
    scheduler_interval_seconds: float = 0.0  # Slurm sched_interval (a scheduler pass)
    process_group_timeout_seconds: float = 0.0  # collective timeout (NCCL watchdog / gloo)
    checkpoint_load_seconds: float = 0.0  # reading the last checkpoint on restart
    job_start_seconds: float = 0.0  # launch overhead (interpreter, rendezvous); not configured: 0 by default


@dataclass(frozen=True)
class Floor:
    detect: float | None
    isolate: float | None
    recover: float | None  # None: the class does not interrupt the workload


def _alert(iv: Intervals) -> float | None:
    if iv.rule_for_seconds is None:
        return None
    return iv.scrape_seconds / 2 + iv.evaluation_seconds / 2 + iv.rule_for_seconds


def _health(iv: Intervals) -> float | None:
    return None if iv.health_check_seconds is None else iv.health_check_seconds / 2


def _slurm_down(iv: Intervals) -> float | None:
    """Slurm marks a silent node DOWN after SlurmdTimeout (slurm.conf(5)); slurmctld pings nodes
    every SlurmdTimeout/3 in integer seconds (`ping_interval = slurmd_timeout / 3` in
    src/slurmctld/controller.c) and a ping fails after MessageTimeout. sandbox-notes.md measured
    16-21 s for 10 s / 5 s; this formula gives 16.5 s."""
    if iv.slurmd_timeout_seconds is None:
        return None
    ping = float(int(iv.slurmd_timeout_seconds) // 3)
    return iv.slurmd_timeout_seconds + ping / 2 + iv.message_timeout_seconds


def _first(*paths: float | None) -> float | None:
    known = [p for p in paths if p is not None]
    return min(known) if known else None


def _restart(iv: Intervals) -> float:
    """Failed job -> first step of the next incarnation: the resubmit delay, half a scheduler pass,
    launch, checkpoint load (ADR 0007)."""
    return (
        iv.resubmit_delay_seconds + iv.scheduler_interval_seconds / 2 + iv.job_start_seconds
        + iv.checkpoint_load_seconds
    )


_GPU = {FaultClass.GPU_FATAL, FaultClass.GPU_CONTAINED, FaultClass.GPU_DEGRADED}
_NODE = {FaultClass.NODE_CRASH, FaultClass.NODE_HANG}
_LINK = {FaultClass.FABRIC_LINK_DOWN, FaultClass.FABRIC_FLAP, FaultClass.FABRIC_SWITCH_DOWN}


def floor_seconds(fault_class: FaultClass | str, iv: Intervals) -> Floor:
    """Floor of detect / isolate / recover seconds for one fault class (docs/slo.md)."""
    fc = FaultClass(fault_class)
    alert, health, down = _alert(iv), _health(iv), _slurm_down(iv)
    recover: float | None
    if fc in _GPU:
        detect = _first(alert, health)
        isolate = _first(health, alert) if fc.isolates_node else None
        # The ranks on the faulty GPU die at once (the agent kills them, as a real fatal XID does);
        # the job is requeued, and a fatal fault must also be isolated before the job lands again.
        start = 0.0 if isolate is None else isolate
        recover = start + _restart(iv)
    elif fc in _NODE:
        detect = _first(down, alert)
        isolate = down
        # The job on a dead node is requeued when Slurm marks the node DOWN.
        recover = None if down is None else down + _restart(iv)
    elif fc in _LINK:
        detect = _first(alert, health)
        isolate = _first(health, down)
        # Collectives over the cut link time out, the job fails and is requeued on healthy nodes.
        stall = iv.process_group_timeout_seconds
        recover = max(stall, isolate if isolate is not None else stall) + _restart(iv)
    else:
        detect = _first(alert, health)
        isolate = None
        recover = None
    if not fc.interrupts_training:  # ridden through: nothing to recover (core.taxonomy)
        recover = None
    return Floor(detect, isolate, recover)
