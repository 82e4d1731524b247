"""Checks of an experiment that only the extension can make, before anything runs (`gpufleet chaos
validate`). chaoslib checks the experiment format and that each activity's module and function exist;
this checks what the values mean to gpufleet:

- configuration: no unknown `gpufleet_*` key, valid values (backend, fault class, booleans, budget
  override), a stack that exists and loads, a catalog that loads;
- every gpufleet activity: arguments the function takes (none missing, none unknown), each of the
  annotated type; `fault_id` in the catalog, of the class `gpufleet_fault_class` says when it says
  one, and injectable by the backend (its declared capabilities) where the activity injects the
  catalog's fault (`inject_*`); `fault_class` a known class; `node` / `nodes` valid node
  selectors naming a node of the stack (or a job index within the sandbox's training job); `gpu`
  within the stack's gpusPerNode; `rail` within its railsPerNode.

Values given as Chaos Toolkit substitutions (`${var}`) are resolved only at run time: not checked.
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InvalidActivity

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.chaos import ACTIVITY_MODULES
from gpufleet.chaos.backends.registry import backend_class
from gpufleet.chaos.discovery import activity_hints
from gpufleet.chaos.selectors import IdleNode, JobNode, NamedNode, ServingNode, parse_node_selector
from gpufleet.chaos.settings import BACKENDS, KNOWN_KEYS, parse_settings, stacks_dir_of
from gpufleet.config import StackSpec, load_named_stack
from gpufleet.config.model import KarpenterProvisioning, NodePool
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.taxonomy import FaultClass

_CHAOSLIB_ARGS = ("configuration", "secrets")


def _is_substitution(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _accepts(value: Any, hint: Any) -> bool:
    """Does a JSON value fit a resolved annotation? Unknown annotations accept anything."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return isinstance(value, list) and all(_accepts(v, item) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _type_name(hint: Any) -> str:
    """`int`, `str | None`, `list[str]`: as the signature reads."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


class _Experiment:
    """The stack, catalog and backend an experiment's configuration names, loaded once."""

    def __init__(self, config: dict[str, Any], problems: list[Problem], stacks_dir: Path | None) -> None:
        self.problems = problems
        self.stack: StackSpec | None = None
        self.catalog: Catalog | None = None
        self.backend: str | None = None
        for key in sorted(k for k in config if k.startswith("gpufleet_") and k not in KNOWN_KEYS):
            self.add(f"configuration.{key}", f"unknown key; known: {', '.join(sorted(KNOWN_KEYS))}")
        # A value given as a chaostoolkit dynamic entry ({"type": "env", ...}) is known at run time only.
        # Unknown keys are reported above, once.
        static = {
            k: v
            for k, v in config.items()
            if (k in KNOWN_KEYS or not k.startswith("gpufleet_"))
            and not (isinstance(v, dict) and "type" in v)
        }
        try:
            parse_settings(static)
        except InvalidActivity as e:
            self.add("configuration", str(e).removeprefix("invalid gpufleet configuration: "))
        fc = static.get("gpufleet_fault_class")
        self.fault_class = fc if isinstance(fc, str) else None
        if fc is not None and fc not in {c.value for c in FaultClass}:
            known = ", ".join(c.value for c in FaultClass)
            self.add("configuration.gpufleet_fault_class", f"unknown fault class {fc!r}; known: {known}")
        stack = static.get("gpufleet_stack")
        if isinstance(stack, str) and not _is_substitution(stack):
            where = stacks_dir or stacks_dir_of(static)
            try:
                self.stack = load_named_stack(stack, where)
            except InputError as e:
                for p in e.problems:
                    self.add("configuration.gpufleet_stack", f"{e.file}: {p}")
        backend = static.get("gpufleet_backend")
        if backend in BACKENDS:
            self.backend = backend
        elif self.stack is not None:
            self.backend = self.stack.gameday.backend
        catalog_dir = static.get("gpufleet_catalog_dir")
        try:
            self.catalog = load_catalog(str(catalog_dir)) if catalog_dir else load_catalog()
        except InputError as e:
            for p in e.problems:
                self.add("configuration.gpufleet_catalog_dir", f"{e.file}: {p}")

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    # ------------------------------------------------------------------ nodes, GPUs, rails

    def _known_nodes(self) -> dict[str, NodePool] | None:
        """Node name -> pool when the stack fixes the names (static and sandbox pools)."""
        if self.stack is None or any(isinstance(p.provisioning, KarpenterProvisioning)
                                     for p in self.stack.node_pools):
            return None
        return {name: pool for pool in self.stack.node_pools for name in pool.node_names()}

    def node(self, at: str, value: str) -> NodePool | None:
        """Check a node selector; the pool it names, when known."""
        try:
            selector = parse_node_selector(value)
        except ValueError as e:
            self.add(at, str(e))
            return None
        if self.stack is None:
            return None
        if isinstance(selector, JobNode):
            sandbox = self.stack.sandbox
            if sandbox is not None and selector.index >= sandbox.training.nodes:
                self.add(at, f"{value}: the stack's training job runs on {sandbox.training.nodes} node(s) "
                             f"(@job:0 to @job:{sandbox.training.nodes - 1})")
            pools = self.stack.node_pools
            return pools[0] if len(pools) == 1 else None
        if isinstance(selector, IdleNode):
            total = sum(p.total_nodes for p in self.stack.node_pools)
            busy = self.stack.sandbox.training.nodes if self.stack.sandbox is not None else 0
            if selector.index >= total - busy:
                self.add(at, f"{value}: the stack has {total - busy} node(s) besides the job's")
            pools = self.stack.node_pools
            return pools[0] if len(pools) == 1 else None
        if isinstance(selector, ServingNode):
            sandbox = self.stack.sandbox
            if sandbox is None or sandbox.serving is None:
                return None  # a serving workload outside the sandbox: its replicas are the backend's
            pool = next((p for p in self.stack.node_pools if p.name == sandbox.serving.pool), None)
            if pool is not None and selector.index >= pool.total_nodes:
                self.add(at, f"{value}: the serving pool {pool.name} has {pool.total_nodes} replica(s) "
                             f"(@serving:0 to @serving:{pool.total_nodes - 1})")
            return pool
        assert isinstance(selector, NamedNode)
        known = self._known_nodes()
        if known is None:
            return None
        if selector.name not in known:
            names = sorted(known)
            shown = ", ".join(names[:8]) + (f" ... ({len(names)} nodes)" if len(names) > 8 else "")
            self.add(at, f"no node {selector.name!r} in the stack; its nodes: {shown}")
            return None
        return known[selector.name]

    def gpu(self, at: str, value: int, pool: NodePool | None) -> None:
        if self.stack is None:
            return
        pools = [pool] if pool is not None else self.stack.node_pools
        most = max(p.gpus_per_node for p in pools)
        if not 0 <= value < most:
            where = f"pool {pool.name}" if pool is not None else "the stack"
            self.add(at, f"GPU index {value} out of range: {where} has {most} GPUs per node "
                         f"(0 to {most - 1})")

    def rail(self, at: str, value: int) -> None:
        if self.stack is None:
            return
        rails = self.stack.fabric.rails_per_node
        if not 0 <= value < rails:
            self.add(at, f"rail {value} out of range: the stack has {rails} rail(s) per node "
                         f"(0 to {rails - 1})")

    def fault(self, at: str, value: str, injects: bool) -> None:
        if self.catalog is None:
            return
        try:
            fault = self.catalog.get(value)
        except KeyError:
            self.add(at, f"no fault {value!r} in the catalog (`gpufleet catalog list` lists them)")
            return
        said = self.fault_class
        if isinstance(said, str) and said != fault.fault_class.value:
            self.add(at, f"fault {value} is of class {fault.fault_class.value!r} in the catalog, but "
                         f"configuration.gpufleet_fault_class says {said!r}: drop the key (the class comes "
                         "from the fault) or name the fault you mean")
        if not injects or self.backend not in BACKENDS:
            return
        inj = fault.injection_for(self.backend)
        if inj is None:
            self.add(at, f"fault {value} has no injection in the catalog")
            return
        refusal = backend_class(self.backend).refusal(inj)
        if refusal:
            self.add(at, f"fault {value}: {refusal}")

    # ------------------------------------------------------------------ activities

    def activity(self, at: str, provider: dict[str, Any]) -> None:
        module, func_name = provider.get("module"), provider.get("func")
        if not isinstance(module, str) or not module.startswith("gpufleet."):
            return  # another extension's activity: chaoslib checks it exists
        if module not in ACTIVITY_MODULES:
            known = ", ".join(ACTIVITY_MODULES)
            self.add(f"{at}.module", f"{module} is not an activity module; known: {known}")
            return
        mod = importlib.import_module(module)
        exported = getattr(mod, "__all__", ())
        if not isinstance(func_name, str) or func_name not in exported:
            self.add(f"{at}.func", f"{module} has no activity {func_name!r}; it has: {', '.join(exported)}")
            return
        func: Callable[..., Any] = getattr(mod, func_name)
        args = provider.get("arguments") or {}
        if not isinstance(args, dict):
            return  # chaoslib reports it
        self.arguments(f"{at}.arguments", func, args)

    def arguments(self, at: str, func: Callable[..., Any], args: dict[str, Any]) -> None:
        params = {n: p for n, p in inspect.signature(func).parameters.items() if n not in _CHAOSLIB_ARGS}
        for name in sorted(set(args) - set(params)):
            self.add(f"{at}.{name}", f"unknown argument of {func.__name__}; it takes: {', '.join(params)}")
        for name, p in params.items():
            if p.default is inspect.Parameter.empty and name not in args:
                self.add(f"{at}.{name}", f"required argument of {func.__name__} is missing")
        hints = activity_hints(func)
        pool: NodePool | None = None
        ok = {}
        for name, value in args.items():
            if name not in params or _is_substitution(value):
                continue
            if name in hints and not _accepts(value, hints[name]):
                self.add(f"{at}.{name}", f"must be {_type_name(hints[name])} (got {value!r})")
                continue
            ok[name] = value
        if isinstance(ok.get("node"), str):
            pool = self.node(f"{at}.node", ok["node"])
        if isinstance(ok.get("nodes"), list):
            for i, n in enumerate(ok["nodes"]):
                if isinstance(n, str) and not _is_substitution(n):
                    self.node(f"{at}.nodes[{i}]", n)
        if isinstance(ok.get("gpu"), int):
            self.gpu(f"{at}.gpu", ok["gpu"], pool)
        if isinstance(ok.get("rail"), int):
            self.rail(f"{at}.rail", ok["rail"])
        if isinstance(ok.get("fault_id"), str):
            self.fault(f"{at}.fault_id", ok["fault_id"], injects=func.__name__.startswith("inject_"))
        fc = ok.get("fault_class")
        if isinstance(fc, str) and fc not in {c.value for c in FaultClass}:
            self.add(f"{at}.fault_class", f"unknown fault class {fc!r}")


def _providers(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, provider) of every python activity in the hypothesis, method and rollbacks."""
    hypothesis = doc.get("steady-state-hypothesis")
    probes = hypothesis.get("probes") if isinstance(hypothesis, dict) else None
    sections: list[tuple[str, Any]] = [
        ("steady-state-hypothesis.probes", probes),
        ("method", doc.get("method")),
        ("rollbacks", doc.get("rollbacks")),
    ]
    for name, acts in sections:
        for i, act in enumerate(acts if isinstance(acts, list) else []):
            provider = act.get("provider") if isinstance(act, dict) else None
            if isinstance(provider, dict) and provider.get("type") == "python":
                yield f"{name}[{i}].provider", provider


def check_experiment(doc: Any, stacks_dir: Path | None = None) -> list[Problem]:
    """Every gpufleet-specific problem of an experiment document (see the module docstring).
    `stacks_dir` replaces the configuration's gpufleet_stacks_dir when given."""
    if not isinstance(doc, dict):
        return [Problem("(top level)", "an experiment is a JSON object")]
    problems: list[Problem] = []
    config = doc.get("configuration") or {}
    if not isinstance(config, dict):
        return [Problem("configuration", "must be a mapping")]
    exp = _Experiment(config, problems, stacks_dir)
    for at, provider in _providers(doc):
        exp.activity(at, provider)
    return problems
