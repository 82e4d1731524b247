"""The one path every fault takes: checks, ledger, dry-run, apply, and undo on a failed apply."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, TypeVar

from chaoslib.exceptions import ActivityFailed, InvalidActivity
from chaoslib.types import Configuration
from pydantic import ValidationError

from gpufleet.catalog import Catalog, Fault, load_catalog
from gpufleet.catalog.injection import AnyInjection, InjectionModel, with_overrides
from gpufleet.chaos.backends.base import Backend, Plan, TrainingPods
from gpufleet.chaos.backends.registry import backend_class
from gpufleet.chaos.guard import blast_radius, production_gate, takes_node_down
from gpufleet.chaos.ledger import FaultRecord, Ledger, RevertResult, revert_pending
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.chaos.selectors import IdleNode, NamedNode, ServingNode, parse_node_selector
from gpufleet.chaos.serving.load import LoadRun
from gpufleet.chaos.settings import RUN_KEY, Settings, parse_settings
from gpufleet.chaos.watch import PodWatcher, SchedulerWatcher
from gpufleet.config import StackSpec, load_named_stack
from gpufleet.core.errors import InputError
from gpufleet.core.ledger_location import configmap_location
from gpufleet.core.sandbox_contract import KubeSandboxState, read_kube_state

logger = logging.getLogger("chaostoolkit")


@dataclass
class RunState:
    """What one experiment run knows: its id (the ledger's run_id), its timelines, its scheduler
    watcher. Passed to activities through their configuration (RUN_KEY), never a module global."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started_at: float = field(default_factory=time.time)
    experiment: str = "adhoc"
    timelines: list[dict[str, Any]] = field(default_factory=list)
    watchers: list[SchedulerWatcher] = field(default_factory=list)
    # The training job's pods, where the backend's workload is pods (Kubernetes); else empty.
    pod_watchers: list[PodWatcher] = field(default_factory=list)
    # Serving loads the run started (gpufleet.chaos.serving.actions.start_load).
    loads: list[LoadRun] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def stop(self) -> None:
        for w in self.watchers:
            w.stop()
        for p in self.pod_watchers:
            p.stop()
        for load in self.loads:
            load.stop()


# Chaos Toolkit hands every control and activity of a run the same configuration dict: the run's id
# travels in it, and the runs of this process are found by id.
_RUNS: dict[str, RunState] = {}
_RUNS_LOCK = threading.Lock()


def new_run(experiment: str, configuration: dict[str, Any] | None = None) -> RunState:
    """A new run, named in `configuration` (the gpufleet-safety control calls this first)."""
    run = RunState(experiment=experiment)
    with _RUNS_LOCK:
        _RUNS[run.run_id] = run
    if configuration is not None:
        configuration[RUN_KEY] = run.run_id
    return run


def run_of(configuration: Configuration | None) -> RunState:
    """The run `configuration` names. Without the control, the first activity starts an ad-hoc run
    and names it in the same configuration dict, so the later activities share it."""
    rid = (configuration or {}).get(RUN_KEY)
    if rid is None:
        return new_run("adhoc", configuration if isinstance(configuration, dict) else None)
    with _RUNS_LOCK:
        found = _RUNS.get(str(rid))
    if found is None:
        raise InvalidActivity(f"{RUN_KEY} {rid!r} names no run of this process (the control sets it; do not)")
    return found


def end_runs() -> None:
    """Stop every run's watchers and loads and forget the runs: at the end of a run's process too.
    Activities called from Python outside a Chaos Toolkit run (an ad-hoc run) leave their pollers
    running; a daemon thread still in a socket call when the interpreter finalizes exits the thread
    from inside that call, and CPython 3.11 then aborts the whole process (SIGABRT, exit 134, seen
    after every test of a module had passed). atexit runs before finalization."""
    with _RUNS_LOCK:
        runs = list(_RUNS.values())
        _RUNS.clear()
    for r in runs:
        r.stop()


atexit.register(end_runs)


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
    run: RunState

    @cached_property
    def ledger(self) -> Ledger:
        """The fault ledger: a file, or a ConfigMap of the cluster (kube_ledger) reached the way
        the kubernetes backend reaches it (context() made sure the backend is that one)."""
        cm = configmap_location(self.settings.ledger)
        if cm is None:
            return Ledger(self.settings.ledger)
        from gpufleet.chaos.backends.kube_ledger import ConfigMapStore

        return Ledger(ConfigMapStore(self.kube_connection(), *cm))

    @property
    def catalog(self) -> Catalog:
        try:
            return _catalog(str(self.settings.catalog_dir) if self.settings.catalog_dir else None)
        except InputError as e:
            raise InvalidActivity(e.render()) from None

    def fault(self, fault_id: str) -> Fault:
        """The catalog's fault; a configured gpufleet_fault_class must agree with its class (the
        class comes from the catalog: an experiment need not restate it)."""
        try:
            fault = self.catalog.get(fault_id)
        except KeyError as e:
            raise InvalidActivity(str(e.args[0])) from None
        said = self.settings.fault_class
        if said is not None and said != fault.fault_class.value:
            raise InvalidActivity(
                f"configuration gpufleet_fault_class is {said!r} but fault {fault_id} is of class "
                f"{fault.fault_class.value!r} in the catalog: drop the key (the class comes from the "
                "fault) or name the fault you mean"
            )
        return fault

    def backend_class(self) -> type[Backend]:
        try:
            return backend_class(self.backend_name)
        except ValueError as e:
            raise InvalidActivity(str(e)) from None

    def backend(self) -> Backend:
        s = self.settings
        if self.backend_name == "sandbox":
            from gpufleet.chaos.backends.sandbox import SandboxBackend

            if not s.stack:
                raise InvalidActivity("the sandbox backend needs configuration gpufleet_stack")
            return SandboxBackend(s.stack, s.sandbox_root)
        if self.backend_name == "storage":
            from gpufleet.chaos.backends.storage import StorageBackend

            if not s.stack:
                raise InvalidActivity("the storage backend needs configuration gpufleet_stack")
            return StorageBackend(s.stack, s.sandbox_root, self.ledger)
        if self.backend_name == "slurm":
            from gpufleet.chaos.backends.slurm import SlurmBackend

            return SlurmBackend(s.ssh, s.fabric_ifname, s.prometheus_url)
        return self._kubernetes_backend()

    def _kubernetes_backend(self) -> Backend:
        """The Kubernetes backend: to the API server the configuration names, else to the stack's
        Kubernetes sandbox when one is up (its state file names the chaos ServiceAccount's
        kubeconfig, the fault namespace, the training Job and its daemons), else to the default
        kubeconfig or the in-cluster service account."""
        from gpufleet.catalog import isolating_xids, xid_policy
        from gpufleet.chaos.backends.kubernetes import KubernetesBackend

        s = self.settings
        kube = self._kube_sandbox_unless_explicit()
        image = s.k8s_image or (self.stack.gameday.image if self.stack else "")
        if not image:
            raise InvalidActivity(
                "the kubernetes backend needs gpufleet_k8s_image or a stack with gameday.image"
            )
        ns = s.k8s_namespace or (kube.chaos_namespace if kube is not None else None) or (
            self.stack.gameday.namespace if self.stack else "gpufleet-gameday"
        )
        training = s.k8s_training_job
        if training is None and kube is not None and kube.training_job_name:
            training = (kube.training_namespace or "default", kube.training_job_name)
        table, _ = xid_policy(self.catalog, self.stack.remediation.xid_overrides if self.stack else {})
        return KubernetesBackend(
            self.kube_connection(),
            ns, image, s.fabric_ifname, s.prometheus_url,
            isolating_xids=isolating_xids(table),
            training_job=training,
            daemons=kube.processes if kube is not None else (),
            agents={n: a for n in kube.kubelet_nodes if (a := kube.kubelet_agent(n)) is not None}
            if kube is not None else None,
        )

    def _kube_sandbox_unless_explicit(self) -> KubeSandboxState | None:
        s = self.settings
        return None if (s.k8s_host or s.kubeconfig or s.k8s_context) else self.kube_sandbox()

    def kube_connection(self) -> dict[str, Any]:
        """The API server the configuration names, else the stack's Kubernetes sandbox's (its chaos
        ServiceAccount's kubeconfig), else the default kubeconfig or the in-cluster account."""
        from gpufleet.chaos.backends.kubernetes import connection

        s = self.settings
        kube = self._kube_sandbox_unless_explicit()
        kubeconfig = kube.chaos_kubeconfig if kube is not None else s.kubeconfig
        return connection(s.k8s_host, kubeconfig, s.k8s_context)

    def kube_sandbox(self) -> KubeSandboxState | None:
        """The stack's Kubernetes sandbox, when one is up (its state file; ADR 0034)."""
        if not self.settings.stack:
            return None
        try:
            state = read_kube_state(self.settings.stack, self.settings.sandbox_root)
        except (OSError, ValueError):
            return None
        return state if state.phase == "up" and state.chaos_kubeconfig else None


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
    if backend != "kubernetes" and configmap_location(s.ledger) is not None:
        raise InvalidActivity(
            f"a ConfigMap ledger ({s.ledger}) needs the kubernetes backend (this run's is {backend})")
    return Context(s, stack, backend, run_of(configuration))


def injection_for(fault: Fault, backend: str) -> AnyInjection | None:
    """The catalog's injection of `fault` for `backend` (its override, else the common one)."""
    return fault.injection_for(backend)


M = TypeVar("M", bound=InjectionModel)


def build_injection(model: type[M], **fields: Any) -> M:
    """An injection model from an action's arguments; a bad value is an InvalidActivity."""
    try:
        return model(**fields)
    except ValidationError as e:
        raise InvalidActivity(f"{model.model_fields['method'].default}: {_errors(e)}") from None


def _errors(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(model)'}: {err['msg']}"
                     for err in e.errors())


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


def ensure_watcher(run: RunState, backend: Backend) -> SchedulerWatcher:
    """The run's scheduler watcher, started (baseline sample first) before the first fault; with it,
    where the backend's workload is pods, the run's pod watcher (pod_watcher)."""
    with run.lock:
        if not run.watchers:
            w = SchedulerWatcher(backend.node_states)
            w.start()
            run.watchers.append(w)
            try:
                has_pods = backend.training_pods() is not None
            except ActivityFailed as e:
                logger.warning("gpufleet: the training job's pods cannot be read: %s", e)
                has_pods = False
            if has_pods:
                p = PodWatcher(_training_pods_of(backend))
                p.start()
                run.pod_watchers.append(p)
        watcher: SchedulerWatcher = run.watchers[0]
        return watcher


def _training_pods_of(backend: Backend) -> Callable[[], TrainingPods]:
    def sample() -> TrainingPods:
        pods = backend.training_pods()
        if pods is None:
            raise ActivityFailed("the backend names no training job any more")
        return pods

    return sample


def pod_watcher(run: RunState) -> PodWatcher | None:
    """The run's pod watcher (started by ensure_watcher), None where the workload is not pods."""
    with run.lock:
        return run.pod_watchers[0] if run.pod_watchers else None


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
        run_id=ctx.run.run_id,
        dry_run=ctx.settings.dry_run,
    )
    ledger = ctx.ledger
    if not ctx.settings.dry_run:
        ensure_watcher(ctx.run, backend)
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
    kinds: AbstractSet[str] | None = None,
    node: str | None = None,
    this_run_only: bool = False,
) -> list[RevertResult]:
    ledger = ledger_of(configuration)
    ids = {
        r.id
        for r in ledger.pending(run_of(configuration).run_id if this_run_only else None)
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


def ledger_location_of(configuration: Configuration | None) -> str:
    return parse_settings(configuration).ledger


def inject_catalog_fault(
    configuration: Configuration | None,
    fault_id: str,
    node: str | None,
    gpu: int = 0,
    allow_spare_exhaustion: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Inject a catalog fault with its injection for this backend (the override for the backend,
    else the common one), with `overrides` replacing some of its parameters."""
    ctx = context(configuration)
    fault = ctx.fault(fault_id)
    injection = fault.injection_for(ctx.backend_name)
    if injection is None:
        raise InvalidActivity(f"fault {fault_id} has no injection in the catalog")
    try:
        injection = with_overrides(injection, overrides)
    except ValidationError as e:
        raise InvalidActivity(f"fault {fault_id}: overrides {overrides}: {_errors(e)}") from None
    except ValueError as e:
        raise InvalidActivity(f"fault {fault_id}: {e}") from None
    return _inject(ctx, injection, fault, node, gpu, allow_spare_exhaustion)


def inject(
    configuration: Configuration | None,
    injection: AnyInjection,
    fault_id: str | None,
    node: str | None = None,
    gpu: int = 0,
    allow_spare_exhaustion: bool = False,
) -> dict[str, Any]:
    """Inject `injection` (an action's own parameters), recorded as fault `fault_id` of the catalog."""
    ctx = context(configuration)
    fault = ctx.fault(fault_id) if fault_id is not None else None
    return _inject(ctx, injection, fault, node, gpu, allow_spare_exhaustion)


def _inject(
    ctx: Context,
    injection: AnyInjection,
    fault: Fault | None,
    node: str | None,
    gpu: int,
    allow_spare_exhaustion: bool,
) -> dict[str, Any]:
    """The one path of every injection: capability, node, plan (dispatched on the model's type by
    Backend.plan), node-down accounting, execute."""
    refusal = ctx.backend_class().refusal(injection)
    if refusal:
        raise InvalidActivity(refusal + (f" (fault {fault.id})" if fault else ""))
    if injection.needs_node and not node:
        raise InvalidActivity(f"{injection.method} needs a node" + (f" (fault {fault.id})" if fault else ""))
    backend = ctx.backend()
    n = resolve_node(backend, str(node)) if node and injection.needs_node else ""
    plan = backend.plan(injection, n, gpu)
    if n and takes_node_down(plan.kind, fault.fault_class.value if fault else None):
        plan.nodes_down = plan.nodes_down | {n}
    return execute(ctx, backend, plan, fault.id if fault else None, allow_spare_exhaustion)


def resolve_node(backend: Backend, node: str) -> str:
    """`@job:<i>` names the i-th node the training job runs on now (experiments must hit the job),
    `@idle:<i>` the i-th schedulable node without it, `@serving:<i>` the node of the serving
    workload's i-th replica; any other selector is a node name
    (gpufleet.chaos.selectors)."""
    try:
        selector = parse_node_selector(node)
    except ValueError as e:
        raise InvalidActivity(str(e)) from None
    if isinstance(selector, NamedNode):
        return selector.name
    i = selector.index
    if isinstance(selector, ServingNode):
        target = backend.serving()
        replicas = list(target.replicas) if target is not None else []
        if not 0 <= i < len(replicas):
            raise ActivityFailed(f"{node}: the serving workload's replicas are on {replicas or 'no node'}")
        return replicas[i]
    job = backend.job_nodes()
    if isinstance(selector, IdleNode):
        states = backend.node_states()
        idle = [n.name for n in backend.nodes() if n.role != "serving" and n.name not in job
                and n.name in states and states[n.name].schedulable]
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
    return sum(1 for r in ledger_of(configuration).pending() if r.run_id != run_id)


def ledger_of(configuration: Configuration | None) -> Ledger:
    """The configuration's ledger; a file ledger needs neither a stack nor a backend."""
    s = parse_settings(configuration)
    return Ledger(s.ledger) if configmap_location(s.ledger) is None else context(configuration).ledger
