"""Workload probes: progress, the recovery timeline, and the recovery verdict against the budget."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from chaoslib.exceptions import ActivityFailed, InvalidActivity
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine, prometheus
from gpufleet.chaos.serving.probes import serving_run
from gpufleet.chaos.timeline import (
    TimelineInputs,
    WorkloadFacts,
    build_timeline,
    first_problem,
    stalled_now,
    workload_facts,
    workload_noticed,
)
from gpufleet.core.training_events import read_events
from gpufleet.slo import EventKind, RunInputs, Timeline, judge_run

__all__ = [
    "capacity_during_fault",
    "recovery_timeline",
    "recovery_within_budget",
    "training_pods_running",
    "training_progressing",
]

logger = logging.getLogger("chaostoolkit")
WAIT_CONDITIONS = ("detected", "alerted", "isolated", "interrupted", "resumed", "returned", "settled")


def training_progressing(
    min_steps_per_second: float = 1.0,
    window_seconds: float = 10.0,
    source: str = "events",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> bool:
    """True when the training job made at least `min_steps_per_second` steps per second over the
    last `window_seconds`: from the training events JSONL the sandbox names (`source: events`) or
    from Prometheus `gpufleet_training_step` (`source: prometheus`)."""
    b = engine.context(configuration).backend()
    if source == "prometheus":
        url = b.prometheus_url()
        if url is None:
            raise ActivityFailed("no Prometheus URL")
        res = prometheus.instant(url, f"sum(rate(gpufleet_training_step[{max(int(window_seconds), 2)}s]))")
        if not res:
            raise ActivityFailed("gpufleet_training_step has no samples: progress unknown")
        rate = float(res[0]["value"][1])
    elif source == "events":
        path = b.workload_events()
        if path is None:
            raise ActivityFailed("the backend names no training events file")
        rate = _event_step_rate(path, window_seconds)
    else:
        raise InvalidActivity("source must be events or prometheus")
    logger.info("training step rate %.2f/s (threshold %.2f/s)", rate, min_steps_per_second)
    return rate >= min_steps_per_second


def training_pods_running(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """True when every pod the training job needs is Running and Ready (Kubernetes: the Job's
    parallelism), none pending: the workload's steady state where it is pods. Unknown (the backend
    names no training job, or cannot read it) is an error, not a False."""
    pods = engine.context(configuration).backend().training_pods()
    if pods is None:
        raise ActivityFailed("the backend names no training job whose pods to check")
    logger.info("training job %s: %d of %d pods Running, %d pending", pods.job, pods.running, pods.wanted,
                pods.pending)
    return pods.complete and pods.pending == 0


def _event_step_rate(path: str, window_seconds: float) -> float:
    """Steps per second of the current incarnation over the last `window_seconds`. Steps are logged
    about once a second per rank, so right after a restart there is too little to judge: wait (at most
    one more window) until the incarnation has spanned half a window."""
    deadline = time.monotonic() + window_seconds
    while True:
        now = time.time()
        since = now - window_seconds
        steps = [e for e in read_events(path) if e.event == "step" and e.step is not None and e.t >= since]
        if steps:
            steps = [e for e in steps if e.restart == steps[-1].restart]
        span = steps[-1].t - steps[0].t if len(steps) >= 2 else 0.0
        stale = not steps or now - steps[-1].t > window_seconds / 2
        if (span >= window_seconds / 2 and not stale) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if len(steps) < 2 or stale or span <= 0:
        return 0.0
    return ((steps[-1].step or 0) - (steps[0].step or 0)) / span


def _run_records(ctx: engine.Context) -> list[Any]:
    return [r for r in ctx.ledger.records() if r.run_id == ctx.run.run_id and not r.dry_run]


def recovery_timeline(
    fault_id: str | None = None,
    nodes: list[str] | None = None,
    wait_for: list[str] | None = None,
    timeout_seconds: float = 120.0,
    stall_seconds: float = 3.0,
    experiment: str | None = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Wait (at most `timeout_seconds`) until every condition in `wait_for` holds — any of
    detected, alerted (the fault's catalog alert fired: a health check may detect first, and a
    fault reverted before its alert fires leaves the alert unshown), isolated, interrupted, resumed
    (first training step after the fault's restart/stall), returned (the faulted nodes are
    schedulable again), settled (the workload steps now, and resumed if it was interrupted: for
    faults it may ride through) — then build the recovery timeline of this run's faults from the
    fault ledger (injected / reverted), Prometheus (first firing sample of the catalog alert of
    `fault_id`), the scheduler (drain/down and return, polled since the injection) and the training
    events (interrupted, resumed, resumed-from step). Returns `gpufleet.slo.Timeline` as JSON; the
    time-out is not an error: the timeline shows what happened."""
    wait = list(wait_for if wait_for is not None else ["resumed"])
    bad = sorted(set(wait) - set(WAIT_CONDITIONS))
    if bad:
        raise InvalidActivity(f"wait_for: unknown conditions {bad}; use {list(WAIT_CONDITIONS)}")
    ctx = engine.context(configuration)
    backend = ctx.backend()
    records = _run_records(ctx)
    if not records:
        raise ActivityFailed("no fault of this run is in the ledger: nothing to build a timeline of")
    fid = fault_id or next((r.fault_id for r in records if r.fault_id), None)
    if fid is None and ctx.settings.fault_class is not None:
        # A planned operation (a rolling restart) names no catalog fault: its ledger kind stands for
        # it, judged as the class the experiment configures, with no alert to read.
        fid = records[0].kind
    if fid is None:
        raise InvalidActivity("recovery_timeline needs fault_id (no fault of this run names one)")
    alert = None
    fault_class = ctx.settings.fault_class
    try:
        f = ctx.catalog.get(fid)
        alert = f.alert.name if f.alert else None
        fault_class = fault_class or f.fault_class.value
    except KeyError:
        logger.warning(
            "fault %s is not in the catalog: no alert to read, detection from the scheduler only", fid
        )
    if fault_class is None:
        raise InvalidActivity(f"fault class unknown for {fid}: set configuration gpufleet_fault_class")
    if "alerted" in wait and alert is None:
        raise InvalidActivity(f"wait_for alerted: fault {fid} has no catalog alert to wait for")
    targets = set(nodes or [str(r.target["node"]) for r in records if r.target.get("node")])
    run = ctx.run
    watcher = engine.ensure_watcher(run, backend)
    t0 = min(r.at for r in records)
    crash_fault = any(r.kind == "kill-rank" for r in records)
    url = backend.prometheus_url()
    events_path = backend.workload_events()
    pods = engine.pod_watcher(run)
    deadline = time.monotonic() + max(0.0, timeout_seconds)

    def gather(now: float) -> TimelineInputs:
        first_fire = None
        if url and alert:
            try:
                first_fire = prometheus.alert_firing_since(url, alert, t0 - 1, now, 1.0)
            except ActivityFailed as e:
                logger.warning("alert source unreadable: %s", e)
        events = read_events(events_path) if events_path else None
        facts = workload_facts(events, t0, stall_seconds) if events is not None else None
        if facts is not None and facts.interrupted_at is None and events is not None:
            st = stalled_now(events, now, stall_seconds)
            if st is not None and st >= t0 - stall_seconds:
                facts = WorkloadFacts(
                    st, None, facts.steps_at_fault, facts.checkpoint_step_at_fault, None, False
                )
        led = ctx.ledger
        health = None
        for tr in watcher.transitions():
            # The scheduler noticing the node (not responding, or drained by the health check with
            # a reason) is a detection in its own right.
            if tr.node in targets and not tr.schedulable and tr.at >= t0:
                rt = tr.reason_time
                health = (
                    rt if rt is not None and t0 <= rt <= tr.at else tr.at,
                    f"scheduler: {tr.node} {tr.state} {tr.reason}".strip(),
                )
                break
        snapshot = watcher.snapshot()
        reported = first_problem(snapshot, targets, t0)
        if reported is not None and (health is None or reported[0] < health[0]):
            health = (reported[0], f"node reports a problem: {reported[1]}")
        total_nodes = (
            sum(p.total_nodes for p in ctx.stack.node_pools) if ctx.stack else len(watcher.baseline()) or None
        )
        return TimelineInputs(
            experiment=experiment or run.experiment,
            fault_id=fid,
            fault_class=fault_class,
            records=records,
            reverted_at={r.id: t for r in records if (t := led.reverted_at(r.id)) is not None},
            window=(min(snapshot[0][0] if snapshot else t0, t0), now),
            alert_name=alert,
            alert_first_firing=first_fire,
            health_detected=health,
            nodes=targets,
            baseline=watcher.baseline(),
            transitions=watcher.transitions(),
            workload=facts,
            nodes_total=total_nodes,
            # A killed rank (kill-rank) has no hardware signal: the job failing fast detects it.
            workload_detected=workload_noticed(events, t0) if events is not None and crash_fault else None,
            pods=pods.snapshot() if pods is not None else None,
        )

    while True:
        now = time.time()
        tl = build_timeline(gather(now))
        have = {e.kind.value for e in tl.events}
        if "returned" in wait:
            latest = watcher.latest()
            if targets and all(latest.get(n) is not None and latest[n].schedulable for n in targets):
                have.add("returned")
            else:
                have.discard("returned")
        if "alerted" in wait:
            fired = any(e.kind is EventKind.DETECTED and e.source == f"prometheus:{alert}" for e in tl.events)
            (have.add if fired else have.discard)("alerted")
        if "settled" in wait:
            have.discard("settled")
            evs = read_events(events_path) if events_path else None
            pods_latest = pods.latest() if pods is not None else None
            steps_now = evs is not None and stalled_now(evs, now, stall_seconds) is None
            pods_now = pods_latest is not None and pods_latest.complete
            if ("interrupted" not in have or "resumed" in have) and (steps_now or pods_now):
                have.add("settled")
        if all(w in have for w in wait) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    missing = [w for w in wait if w not in have]
    if missing:
        logger.warning("recovery_timeline: still waiting for %s after %g s", missing, timeout_seconds)
    doc = tl.model_dump(mode="json")
    with run.lock:
        run.timelines.append(doc)
    return doc


# The tolerance of `recovery_within_budget` in an experiment's steady-state hypothesis: the probe
# returns the verdict (so the journal holds it once) and the hypothesis holds when it is a PASS.
BUDGET_TOLERANCE: dict[str, str] = {"type": "regex", "target": "outcome", "pattern": "^PASS$"}


def recovery_within_budget(
    expect_isolation: bool | None = None,
    expect_interruption: bool | None = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """The steady-state check that enforces the recovery budget: judges this run's latest recovery
    timeline with `gpufleet.slo.judge_run` against the stack's budget for the experiment's fault
    class (replaced key by key by `gpufleet_budget_override`), and returns the verdict
    (`RunVerdict.to_doc()`): Chaos Toolkit writes it into the journal, where the game-day reads it;
    nobody judges the run again. Declare it with tolerance
    `{"type": "regex", "target": "outcome", "pattern": "^PASS$"}`, so FAIL and UNKNOWN make a plain
    `chaos run` deviate. `expect_isolation` / `expect_interruption` left out (null) take the fault
    class's default (`FaultClass.isolates_node` / `interrupts_training`). Before any fault of this
    run (the hypothesis before the method) there is nothing to judge: the output says so, with
    outcome PASS and no checks."""
    for name, value in (("expect_isolation", expect_isolation), ("expect_interruption", expect_interruption)):
        if value is not None and not isinstance(value, bool):
            raise InvalidActivity(f"{name} must be true, false or null (the fault class's default)")
    ctx = engine.context(configuration)
    with ctx.run.lock:
        tl_doc = ctx.run.timelines[-1] if ctx.run.timelines else None
    if tl_doc is None:
        if not _run_records(ctx):
            return {"outcome": "PASS", "before_fault": True,
                    "notes": ["no fault of this run yet: nothing to judge"]}
        raise ActivityFailed(
            "faults were injected but no recovery timeline was built (run recovery_timeline)"
        )
    verdict = judge_run(
        RunInputs(
            timeline=Timeline.model_validate(tl_doc),
            fault_class=ctx.settings.fault_class,
            budgets={fc.value: b for fc, b in ctx.stack.slos.budgets.items()} if ctx.stack else None,
            fault_budgets={fid: o.model_dump() for fid, o in ctx.stack.slos.fault_budgets.items()}
            if ctx.stack else None,
            budget_override=ctx.settings.budget_override,
            expect_isolation=expect_isolation,
            expect_interruption=expect_interruption,
            serving=serving_run(ctx),
        )
    )
    doc = verdict.to_doc()
    logger.info("gpufleet verdict: %s", json.dumps(doc, default=str))
    return doc


def capacity_during_fault(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """From this run's latest timeline: nodes in the cluster, most nodes unavailable at once, and
    whether capacity was degraded (fewer schedulable nodes than the pools' non-spare node count)."""
    ctx = engine.context(configuration)
    with ctx.run.lock:
        tl_doc = ctx.run.timelines[-1] if ctx.run.timelines else None
    if tl_doc is None or ctx.stack is None:
        raise ActivityFailed("no timeline or no stack: capacity unknown")
    tl = Timeline.model_validate(tl_doc)
    points = sorted({s for iv in tl.nodes_unavailable.values() for s, _ in iv} | {tl.window_end})
    worst = 0
    for p in points:
        n = sum(1 for iv in tl.nodes_unavailable.values() for s, e in iv if s <= p and (e is None or p < e))
        worst = max(worst, n)
    total = sum(p.total_nodes for p in ctx.stack.node_pools)
    needed = sum(p.nodes for p in ctx.stack.node_pools)
    return {
        "nodes_total": total,
        "nodes_needed": needed,
        "max_unavailable": worst,
        "min_schedulable": total - worst,
        "degraded": total - worst < needed,
        "isolated": sorted({e.node for e in tl.events if e.kind is EventKind.ISOLATED and e.node}),
    }
