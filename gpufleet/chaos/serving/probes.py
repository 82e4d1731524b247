"""Serving probes: the replicas the balancer sends requests to, and what the run's loads recorded
(the one judge, gpufleet.slo.judge_run, turns the latter into the serving checks)."""

from __future__ import annotations

from collections import Counter

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine
from gpufleet.chaos.serving import load
from gpufleet.slo.serving import ServingRun, ServingTargets, merge_bins

__all__ = ["replicas_in_rotation"]


def replicas_in_rotation(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """True when the balancer sends requests to every replica of the backend's serving workload."""
    backend = engine.context(configuration).backend()
    target = backend.serving()
    if target is None:
        raise ActivityFailed("the backend runs no serving workload")
    states = backend.node_states()
    return all(name in states and states[name].schedulable for name in target.replicas)


def serving_run(ctx: engine.Context) -> ServingRun | None:
    """The run's serving loads, finished (each waits for Locust to end by itself, bounded) and
    binned per second, with the stack's serving targets; None when the run started no load."""
    with ctx.run.lock:
        loads = list(ctx.run.loads)
    if not loads:
        return None
    for lr in loads:
        lr.finish()
    origin = min(lr.started_at for lr in loads)  # one origin: the loads' seconds line up and merge
    bins = merge_bins(*(load.bins(lr.records_dir, origin) for lr in loads))
    slo = ctx.stack.slos.serving if ctx.stack is not None else None
    targets = None if slo is None else ServingTargets(
        availability=slo.availability, p99_ms=slo.p99_ms, recover_s=slo.recover_s,
        window_availability=slo.window_availability)
    errors: Counter[str] = Counter()
    for lr in loads:
        errors.update(load.failure_reasons(lr.records_dir))
    urls = ", ".join(sorted({lr.spec.url for lr in loads}))
    return ServingRun(bins, targets, urls, dict(errors.most_common()))
