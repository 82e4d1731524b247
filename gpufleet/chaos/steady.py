"""The cluster's steady state before an experiment: check it, and heal the cluster back to it.

An experiment is judged on its own run only if it starts from the steady state: every daemon up,
every node schedulable and reporting no problem, nothing pending in the fault ledger, no critical
alert firing, and the training job running and making progress (where the workload is pods, as on
Kubernetes: every pod the training Job needs Running and Ready, none pending).
`problems` decides from observations (pure); `observe` collects them from a backend; `heal` undoes
what is wrong (revert the ledger, restart dead daemons, resume nodes, ask the auto-resume controller
for a job) and waits, bounded, for the steady state. The game-day runs `ensure` before every
experiment and records what it healed; a plain `chaos run` runs `check` through the control
(gpufleet.chaos.control) and stops with "cluster not in steady state: ..." instead of failing
confusingly later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaoslib.exceptions import ActivityFailed

from gpufleet.chaos import prometheus
from gpufleet.chaos.backends.base import Backend, TrainingPods
from gpufleet.chaos.ledger import Ledger, revert_pending
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.core.slurm_state import NodeObs
from gpufleet.core.training_events import TrainingEvent, read_events

logger = logging.getLogger("chaostoolkit")

# Training counts as progressing when its newest step is at most this old and its incarnation has
# made at least MIN_STEPS steps (it logs about one step event per second per rank).
STEP_FRESH_S = 5.0
MIN_STEPS = 2
CRITICAL = "critical"


@dataclass(frozen=True)
class Observation:
    dead_daemons: tuple[str, ...]
    nodes: dict[str, NodeObs]
    pending_faults: tuple[str, ...]  # "kind target (run id)" of ledger entries not reverted
    critical_alerts: tuple[str, ...]  # "alertname{host}" firing now
    job_nodes: tuple[str, ...]
    last_step_age_s: float | None  # seconds since the newest step event; None: no step at all
    steps_this_incarnation: int
    training_note: str = ""  # e.g. the auto-resume controller gave up
    workload_known: bool = True  # False: the backend names no training job to check
    unknown: tuple[str, ...] = ()  # observations that could not be made
    # Alerts that must detect the coming experiment's fault and already fire (any severity): its
    # detection could not be measured, so wait for them to resolve.
    busy_alerts: tuple[str, ...] = ()
    # Where the workload is pods (Kubernetes): the training Job's pods, instead of steps.
    pods: TrainingPods | None = None


def problems(obs: Observation) -> list[str]:
    """Why the cluster is not in its steady state (empty when it is). Pure."""
    out = [f"could not observe {u}" for u in obs.unknown]
    out += [f"daemon {d} is not running" for d in obs.dead_daemons]
    out += [
        f"node {n.name} is not schedulable ({n.state}{': ' + n.reason if n.reason else ''})"
        for n in obs.nodes.values() if not n.schedulable
    ]
    out += [f"node {n.name} reports a problem ({n.reason or n.state})"
            for n in obs.nodes.values() if n.schedulable and n.problem]
    out += [f"fault still pending in the ledger: {p}" for p in obs.pending_faults]
    out += [f"critical alert firing: {a}" for a in obs.critical_alerts]
    out += [f"alert {a} already firing: it must detect the coming experiment's fault"
            for a in obs.busy_alerts]
    if not obs.workload_known:
        return out
    if obs.pods is not None:
        p = obs.pods
        if not p.complete or p.pending:
            out.append(
                f"training job {p.job} has {p.running} of {p.wanted} pods Running ({p.pending} pending)"
            )
        return out
    if not obs.job_nodes:
        note = f" ({obs.training_note})" if obs.training_note else ""
        out.append(f"the training job runs on no node{note}")
    elif obs.last_step_age_s is None or obs.last_step_age_s > STEP_FRESH_S:
        age = "no step yet" if obs.last_step_age_s is None else f"last step {obs.last_step_age_s:.0f} s ago"
        out.append(f"training is not making progress ({age})")
    elif obs.steps_this_incarnation < MIN_STEPS:
        out.append(f"training has made only {obs.steps_this_incarnation} step(s) since it started")
    return out


@dataclass(frozen=True)
class HealPlan:
    revert_ledger: bool
    restart_daemons: bool
    resume_nodes: tuple[str, ...]
    resume_training: bool


def heal_plan(obs: Observation) -> HealPlan:
    """What to do about each problem (pure). Nodes are resumed only once their faults are reverted
    and their daemons run again (the plan's steps run in that order)."""
    return HealPlan(
        revert_ledger=bool(obs.pending_faults),
        restart_daemons=bool(obs.dead_daemons),
        resume_nodes=tuple(sorted(n.name for n in obs.nodes.values() if not n.schedulable)),
        resume_training=obs.workload_known and (
            not obs.pods.complete if obs.pods is not None
            else not obs.job_nodes or obs.last_step_age_s is None or obs.last_step_age_s > STEP_FRESH_S
        ),
    )


# --------------------------------------------------------------------------- I/O


def _training(backend: Backend, now: float) -> tuple[float | None, int]:
    path = backend.workload_events()
    if path is None:
        return None, 0
    return training_progress(read_events(path), backend.training_incarnation(), now)


def training_progress(
    events: list[TrainingEvent], incarnation: int | None, now: float
) -> tuple[float | None, int]:
    """(seconds since the current incarnation's newest step, its distinct steps). Pure.

    Only the incarnation running now counts (the platform's, else the newest in the events): a job
    resubmitted a moment ago has made no step yet, however recently the one before it stepped."""
    current = incarnation if incarnation is not None else max((e.restart for e in events), default=None)
    steps = [e for e in events if e.event == "step" and e.restart == current]
    if not steps:
        return None, 0
    return now - steps[-1].t, len({e.step for e in steps})


def _alert_name(labels: dict[str, str]) -> str:
    """`Alert{where}`: the host, else the node (the fabric and GPU alerts carry only `node`), else
    the scrape target."""
    where = labels.get("host") or labels.get("node") or labels.get("instance", "")
    return f"{labels.get('alertname')}{{{where}}}"


def observe(
    backend: Backend, ledger: Ledger, now: float | None = None, quiet: frozenset[str] = frozenset()
) -> Observation:
    """`quiet`: names of the alerts that must detect the coming experiment's fault."""
    now = time.time() if now is None else now
    unknown: list[str] = []
    nodes: dict[str, NodeObs] = {}
    try:
        nodes = backend.node_states()
    except ActivityFailed as e:
        unknown.append(f"node states ({e})")
    pending = tuple(f"{r.kind} {r.target} (run {r.run_id})" for r in ledger.pending() if not r.dry_run)
    alerts: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    url = backend.prometheus_url()
    if url is not None:
        try:
            firing = [a.get("labels", {}) for a in prometheus.firing_alerts(url)]
            alerts = tuple(sorted(_alert_name(lb) for lb in firing if lb.get("severity") == CRITICAL))
            busy = tuple(sorted(_alert_name(lb) for lb in firing
                                if lb.get("alertname") in quiet and lb.get("severity") != CRITICAL))
        except ActivityFailed as e:
            unknown.append(f"alerts ({e})")
    job_nodes: tuple[str, ...] = ()
    try:
        job_nodes = tuple(backend.job_nodes())
    except ActivityFailed as e:
        unknown.append(f"the training job ({e})")
    age, steps = _training(backend, now)
    pods: TrainingPods | None = None
    try:
        pods = backend.training_pods()
    except ActivityFailed as e:
        unknown.append(f"the training job's pods ({e})")
    return Observation(
        dead_daemons=tuple(backend.dead_daemons()), nodes=nodes, pending_faults=pending,
        critical_alerts=alerts, job_nodes=job_nodes, last_step_age_s=age, steps_this_incarnation=steps,
        training_note=backend.training_note(),
        workload_known=backend.workload_events() is not None or pods is not None,
        unknown=tuple(unknown), busy_alerts=busy, pods=pods,
    )


def check(backend: Backend, ledger: Ledger, quiet: frozenset[str] = frozenset()) -> list[str]:
    return problems(observe(backend, ledger, quiet=quiet))


@dataclass
class HealReport:
    """What `ensure` found and did, for the report beside the experiment that follows."""

    problems: list[str] = field(default_factory=list)  # before healing; empty: nothing to heal
    actions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ok: bool = True
    remaining: list[str] = field(default_factory=list)  # problems left when healing gave up

    def to_json(self) -> dict[str, Any]:
        return {"problems": self.problems, "actions": self.actions, "seconds": round(self.seconds, 1),
                "ok": self.ok, "remaining": self.remaining}


def ensure(
    backend_factory: Callable[[], Backend],
    ledger: Ledger,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    quiet: frozenset[str] = frozenset(),
) -> HealReport:
    """Check the steady state; heal and wait (at most `timeout_s`) when it does not hold.

    `backend_factory` is called again after healing because restarting daemons rewrites the state
    the backend was read from."""
    t0 = clock()
    backend = backend_factory()
    obs = observe(backend, ledger, quiet=quiet)
    report = HealReport(problems=problems(obs))
    if not report.problems:
        return report
    logger.warning("gpufleet: cluster not in steady state: %s", "; ".join(report.problems))
    plan = heal_plan(obs)
    try:
        if plan.revert_ledger:
            results = revert_pending(ledger, ROLLBACKS)
            failed = "".join(f"; {r.record.kind} FAILED: {r.error}" for r in results if not r.ok)
            report.actions.append(f"reverted {len(results)} pending fault(s){failed}")
        if plan.restart_daemons:
            report.actions += backend.restart_dead_daemons()
            backend = backend_factory()
        for node in plan.resume_nodes:
            backend.resume_node(node)
        if plan.resume_nodes:
            report.actions.append(f"resumed {', '.join(plan.resume_nodes)}")
        if plan.resume_training:
            report.actions.append(backend.resume_training())
    except ActivityFailed as e:
        report.actions.append(f"healing step failed: {e}")
    left = report.problems
    resumed: set[str] = set(plan.resume_nodes)
    while clock() - t0 < timeout_s:
        sleep(poll_s)
        backend = backend_factory()
        obs = observe(backend, ledger, quiet=quiet)
        left = problems(obs)
        if not left:
            break
        # A node drained by a check that ran between our resume and its daemons' return: resume once more.
        again = [n.name for n in obs.nodes.values() if not n.schedulable and n.name in resumed
                 and "not responding" not in n.state and not n.state.endswith("*")]
        for node in again:
            backend.resume_node(node)
    report.seconds = clock() - t0
    report.ok = not left
    report.remaining = left
    return report
