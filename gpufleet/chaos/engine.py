"""The one path every fault takes: checks, ledger, dry-run, apply, and undo on a failed apply."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed, InvalidActivity
from chaoslib.types import Configuration

from gpufleet.catalog import Catalog, Fault, Injection, load_catalog
from gpufleet.chaos.backends.base import Backend, Plan
from gpufleet.chaos.guard import blast_radius, production_gate
from gpufleet.chaos.ledger import FaultRecord, Ledger, RevertResult, revert_pending
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.chaos.selectors import IdleNode, NamedNode, parse_node_selector
from gpufleet.chaos.settings import Settings, parse_settings
from gpufleet.chaos.watch import SchedulerWatcher
from gpufleet.config import StackSpec, load_named_stack
from gpufleet.core.errors import InputError

logger = logging.getLogger("chaostoolkit")


@dataclass
class RunState:
    """What this process knows about the experiment it runs (one `chaos run` = one process)."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started_at: float = field(default_factory=time.time)
    experiment: str = "adhoc"
    timelines: list[dict[str, Any]] = field(default_factory=list)
    watchers: list[SchedulerWatcher] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


RUN = RunState()


def new_run(experiment: str) -> RunState:
    global RUN
    for w in RUN.watchers:
        w.stop()
    RUN = RunState(experiment=experiment)
    return RUN


@lru_cache(maxsize=8)
def _stack(name: str, stacks_dir: str) -> StackSpec:
    return load_named_stack(name, stacks_dir)


@lru_cache(maxsize=4)
def _catalog(path: str | None) -> Catalog:
    return load_catalog(path) if path else load_catalog()


@dataclass
class Context:
    settings: Settings
    stack: StackSpec | None
    backend_name: str

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.settings.ledger)

    @property
    def catalog(self) -> Catalog:
        try:
            return _catalog(str(self.settings.catalog_dir) if self.settings.catalog_dir else None)
        except InputError as e:
            raise InvalidActivity(e.render()) from None

    def fault(self, fault_id: str) -> Fault:
        try:
            return self.catalog.get(fault_id)
        except KeyError as e:
            raise InvalidActivity(str(e.args[0])) from None

    def backend(self) -> Backend:
        s = self.settings
        if self.backend_name == "sandbox":
            from gpufleet.chaos.backends.sandbox import SandboxBackend

            if not s.stack:
                raise InvalidActivity("the sandbox backend needs configuration gpufleet_stack")
            return SandboxBackend(s.stack, s.sandbox_root)
        if self.backend_name == "slurm":
            from gpufleet.chaos.backends.slurm import SlurmBackend

            return SlurmBackend(s.ssh, s.fabric_ifname, s.prometheus_url)
        from gpufleet.chaos.backends.kubernetes import KubernetesBackend, connection

        ns = s.k8s_namespace or (self.stack.gameday.namespace if self.stack else "gpufleet-gameday")
        image = s.k8s_image or (self.stack.gameday.image if self.stack else "")
        if not image:
            raise InvalidActivity(
                "the kubernetes backend needs gpufleet_k8s_image or a stack with gameday.image"
            )
        return KubernetesBackend(
            connection(s.k8s_host, s.kubeconfig, s.k8s_context), ns, image, s.fabric_ifname, s.prometheus_url
        )


def context(configuration: Configuration | None) -> Context:
    s = parse_settings(configuration)
    stack = None
    if s.stack:
        try:
            stack = _stack(s.stack, str(s.stacks_dir))
        except InputError as e:
            raise InvalidActivity(e.render()) from None
    backend = s.backend or (stack.gameday.backend if stack else None)
    if backend is None:
        raise InvalidActivity(
            "set configuration gpufleet_backend (sandbox | slurm | kubernetes) or gpufleet_stack"
        )
    return Context(s, stack, backend)


def injection_params(ctx: Context, fault: Fault, method: str | None = None) -> dict[str, Any]:
    """The catalog's injection of `fault` for this backend (data, not a hard-coded list)."""
    inj = injection_for(fault, ctx.backend_name)
    if inj is None:
        have = ", ".join(sorted(fault.injection)) or "none"
        raise InvalidActivity(
            f"fault {fault.id} has no injection for backend {ctx.backend_name} (has: {have})"
        )
    if method is not None and inj.method != method:
        raise InvalidActivity(f"fault {fault.id} is injected with {inj.method}, not {method}")
    return dict(inj.params)


def injection_for(fault: Fault, backend: str) -> Injection | None:
    for name, inj in fault.injection.items():
        if name == backend:
            return inj
    return None


def injection_method(fault: Fault, backend: str) -> str | None:
    inj = injection_for(fault, backend)
    return inj.method if inj else None


def _nodes_down_now(ctx: Context, backend: Backend) -> set[str]:
    down = {n for n, obs in backend.node_states().items() if not obs.schedulable}
    for rec in ctx.ledger.pending():
        if rec.params.get("takes_node_down") and rec.target.get("node"):
            down.add(str(rec.target["node"]))
    return down


def check_blast_radius(
    ctx: Context, backend: Backend, targets: set[str], allow_spare_exhaustion: bool
) -> list[str]:
    if ctx.stack is None:
        return ["no stack configured (gpufleet_stack): the blast-radius limit is unknown, refusing"]
    total = sum(p.total_nodes for p in ctx.stack.node_pools)
    spares = sum(p.spares for p in ctx.stack.node_pools)
    return blast_radius(
        _nodes_down_now(ctx, backend),
        targets,
        total,
        spares,
        ctx.stack.gameday.max_nodes_down,
        allow_spare_exhaustion,
    )


def ensure_watcher(backend: Backend) -> SchedulerWatcher:
    """The run's scheduler watcher, started (baseline sample first) before the first fault."""
    with RUN.lock:
        if not RUN.watchers:
            w = SchedulerWatcher(backend.node_states)
            w.start()
            RUN.watchers.append(w)
        watcher: SchedulerWatcher = RUN.watchers[0]
        return watcher


def execute(
    ctx: Context,
    backend: Backend,
    plan: Plan,
    fault_id: str | None = None,
    allow_spare_exhaustion: bool = False,
) -> dict[str, Any]:
    """Guard, write the ledger, then apply (or only print, in dry-run)."""
    env = ctx.stack.cluster.environment.value if ctx.stack else None
    refusal = production_gate(env, ctx.settings.allow_production)
    if refusal:
        raise InvalidActivity(refusal)
    if plan.nodes_down:
        reasons = check_blast_radius(ctx, backend, plan.nodes_down, allow_spare_exhaustion)
        if reasons:
            raise InvalidActivity("blast-radius guard refused: " + "; ".join(reasons))
    params = dict(plan.params)
    if plan.nodes_down:
        params["takes_node_down"] = True
    rec = FaultRecord(
        kind=plan.kind,
        backend=ctx.backend_name,
        target=plan.target,
        rollback=plan.rollback,
        params=params,
        stack=ctx.settings.stack,
        fault_id=fault_id,
        run_id=RUN.run_id,
        dry_run=ctx.settings.dry_run,
    )
    ledger = ctx.ledger
    if not ctx.settings.dry_run:
        ensure_watcher(backend)
    ledger.record(rec)
    out: dict[str, Any] = {
        "id": rec.id,
        "kind": rec.kind,
        "target": rec.target,
        "fault_id": fault_id,
        "at": rec.at,
        "summary": plan.summary,
        "dry_run": ctx.settings.dry_run,
    }
    if ctx.settings.dry_run:
        msg = f"[dry-run] would {plan.summary}; rollback {plan.rollback.name}"
        logger.warning(msg)
        print(msg)
        return out
    logger.info("gpufleet: %s (ledger %s, rollback %s)", plan.summary, rec.id, plan.rollback.name)
    try:
        out["result"] = plan.apply()
    except BaseException as e:
        # Partly applied faults are undone at once; the ledger keeps the entry if that fails too.
        revert_pending(ledger, ROLLBACKS, only={rec.id})
        if isinstance(e, ActivityFailed | InvalidActivity):
            raise
        if isinstance(e, Exception):
            raise ActivityFailed(f"applying {plan.kind} failed: {e}") from e
        raise
    if plan.after is not None:
        plan.after(rec.id, ledger)
    return out


def revert(
    configuration: Configuration | None = None,
    kinds: set[str] | None = None,
    node: str | None = None,
    this_run_only: bool = False,
) -> list[RevertResult]:
    s = parse_settings(configuration)
    ledger = Ledger(s.ledger)
    ids = {
        r.id
        for r in ledger.pending(RUN.run_id if this_run_only else None)
        if (kinds is None or r.kind in kinds) and (node is None or r.target.get("node") == node)
    }
    return revert_pending(ledger, ROLLBACKS, only=ids)


def revert_summary(results: list[RevertResult]) -> dict[str, Any]:
    failed = [f"{r.record.kind} {r.record.target}: {r.error}" for r in results if not r.ok]
    if failed:
        raise ActivityFailed("rollback failed (entries stay in the ledger): " + "; ".join(failed))
    return {
        "reverted": [{"id": r.record.id, "kind": r.record.kind, "target": r.record.target} for r in results]
    }


def ledger_path_of(configuration: Configuration | None) -> Path:
    return parse_settings(configuration).ledger


def inject_catalog_fault(
    configuration: Configuration | None,
    fault_id: str,
    node: str | None,
    gpu: int = 0,
    allow_spare_exhaustion: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Inject a catalog fault with the method and parameters its entry names for this backend."""
    from gpufleet.chaos.guard import takes_node_down

    ctx = context(configuration)
    fault = ctx.fault(fault_id)
    method = injection_method(fault, ctx.backend_name)
    params = {**injection_params(ctx, fault), **overrides}
    backend = ctx.backend()
    needs_node = method not in ("storage-outage", "storage-slow", "kill-rank")
    if needs_node and not node:
        raise InvalidActivity(f"fault {fault_id} ({method}) needs a node")
    n = resolve_node(backend, str(node)) if node else ""
    if method == "dcgm-inject":
        plan = backend.plan_dcgm_inject(n, gpu, params)
    elif method == "node-crash":
        plan = backend.plan_node_crash(n)
    elif method == "node-hang":
        plan = backend.plan_node_hang(n)
    elif method == "node-reboot":
        plan = backend.plan_node_reboot(n, float(params.get("downSeconds", 5)))
    elif method == "link-down":
        plan = backend.plan_link_down(n, int(params.get("rail", 0)))
    elif method == "link-flap":
        plan = backend.plan_link_flap(
            n, int(params.get("rail", 0)), float(params.get("periodSeconds", 4)), int(params.get("count", 5))
        )
    elif method == "link-degrade":
        loss, rate = params.get("lossPercent"), params.get("rateMbit")
        plan = backend.plan_link_degrade(
            n,
            int(params.get("rail", 0)),
            None if loss is None else float(loss),
            None if rate is None else float(rate),
        )
    elif method == "storage-outage":
        plan = backend.plan_storage_outage()
    elif method == "storage-slow":
        plan = backend.plan_storage_slow(float(params.get("rateMbit", 10)))
    elif method == "kill-rank":
        plan = backend.plan_kill_rank(int(params.get("rank", 0)))
    elif method == "host-signal":
        value, add, effect = params.get("value"), params.get("add"), params.get("effect")
        plan = backend.plan_host_signal(
            n, str(params["signal"]), None if value is None else float(value),
            None if add is None else float(add), None if effect is None else str(effect),
        )
    elif method == "switch-down":
        plan = backend.plan_switch_down(n, int(params.get("rail", 0)))
    elif method == "nic-remove":
        plan = backend.plan_nic_remove(n, int(params.get("rail", 0)))
    else:
        raise InvalidActivity(f"fault {fault_id}: unknown injection method {method!r}")
    if node and takes_node_down(plan.kind, fault.fault_class.value):
        plan.nodes_down = plan.nodes_down | {n}
    return execute(ctx, backend, plan, fault_id, allow_spare_exhaustion)


def resolve_node(backend: Backend, node: str) -> str:
    """`@job:<i>` names the i-th node the training job runs on now (experiments must hit the job),
    `@idle:<i>` the i-th schedulable node without it; any other selector is a node name
    (gpufleet.chaos.selectors)."""
    try:
        selector = parse_node_selector(node)
    except ValueError as e:
        raise InvalidActivity(str(e)) from None
    if isinstance(selector, NamedNode):
        return selector.name
    i = selector.index
    job = backend.job_nodes()
    if isinstance(selector, IdleNode):
        states = backend.node_states()
        idle = [n.name for n in backend.nodes() if n.name not in job and n.name in states
                and states[n.name].schedulable]
        if not 0 <= i < len(idle):
            raise ActivityFailed(f"{node}: the schedulable nodes without the job are {idle or 'none'} now")
        return idle[i]
    if not 0 <= i < len(job):
        raise ActivityFailed(f"{node}: the training job runs on {job or 'no node'} now")
    return job[i]


def run_plan(
    configuration: Configuration | None,
    make: Any,
    fault_id: str | None,
    allow_spare_exhaustion: bool = False,
    node: str | None = None,
) -> dict[str, Any]:
    """Build a plan with `make(backend)` (or `make(backend, node)` once a node reference such as
    `@job:0` is resolved) and execute it."""
    ctx = context(configuration)
    backend = ctx.backend()
    plan = make(backend) if node is None else make(backend, resolve_node(backend, node))
    return execute(ctx, backend, plan, fault_id, allow_spare_exhaustion)


def ledger_pending_other_runs(configuration: Configuration | None, run_id: str) -> int:
    return sum(1 for r in Ledger(parse_settings(configuration).ledger).pending() if r.run_id != run_id)
