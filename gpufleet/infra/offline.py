"""Run the Pulumi program offline, under Pulumi's own mock runtime, and record what it declares.

This is what `gpufleet preview`, the unit tests and the scale benchmark use where no Pulumi CLI,
engine or cluster exists. It is NOT `pulumi preview`: nothing is diffed against a state or a
cluster, no provider validates the inputs. It shows the resources, their inputs and the stack
outputs exactly as the program registers them.

How: `pulumi.runtime.set_mocks` replaces the engine and resource monitor; the program runs inside
`pulumi.runtime.test`, which (as `pulumi/runtime/mocks.py` shows) runs the function through
`run_pulumi_func` and waits for every outstanding registration before returning. Importing the
program alone would register nothing.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs

from gpufleet.config import StackSpec
from gpufleet.infra.platform import Platform, PlatformArgs

PROJECT = "gpufleet"
SECRET_MARK = "[secret]"
_STACK_TYPE = "pulumi:pulumi:Stack"


@dataclass(frozen=True)
class DeclaredResource:
    """One registered resource, its inputs with secret values replaced by SECRET_MARK."""

    type: str
    name: str
    urn: str
    parent_urn: str
    custom: bool
    inputs: dict[str, Any]
    secret_paths: tuple[str, ...]  # input paths that arrived as Pulumi secrets
    provider: str = ""  # provider reference (`<urn>::<id>`) of a custom resource; "" for the default
    protect: bool = False
    retain_on_delete: bool = False
    dependencies: tuple[str, ...] = ()  # URNs of its explicit depends_on
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False


@dataclass
class OfflinePreview:
    stack: str
    resources: list[DeclaredResource]
    outputs: dict[str, Any] = field(default_factory=dict)

    def custom(self) -> list[DeclaredResource]:
        return [r for r in self.resources if r.custom]

    def of_type(self, type_: str) -> list[DeclaredResource]:
        return [r for r in self.resources if r.type == type_]

    def by_type(self) -> Counter[str]:
        return Counter(r.type for r in self.custom())

    def component_of(self, res: DeclaredResource) -> DeclaredResource | None:
        """The nearest enclosing component resource."""
        by_urn = {r.urn: r for r in self.resources}
        parent = by_urn.get(res.parent_urn)
        while parent is not None and parent.custom:
            parent = by_urn.get(parent.parent_urn)
        return parent

    def by_component(self) -> Counter[str]:
        """Custom resources per enclosing component type token."""
        by_urn = {r.urn: r for r in self.resources}
        out: Counter[str] = Counter()
        for r in self.custom():
            parent = by_urn.get(r.parent_urn)
            out[parent.type if parent is not None else _STACK_TYPE] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "offline": True,
            "note": "Offline view from Pulumi's mock runtime: not a diff against a cluster or a state.",
            "resourceCount": len(self.custom()),
            "componentCount": len(self.resources) - len(self.custom()),
            "byType": dict(sorted(self.by_type().items())),
            "byComponent": dict(sorted(self.by_component().items())),
            "outputs": self.outputs,
            "resources": [
                {
                    "type": r.type,
                    "provider": r.provider,
                    "protect": r.protect,
                    "retainOnDelete": r.retain_on_delete,
                    "name": r.name,
                    "urn": r.urn,
                    "parent": r.parent_urn,
                    "custom": r.custom,
                    "secretInputs": list(r.secret_paths),
                    "inputs": r.inputs,
                }
                for r in self.resources
            ],
        }


def redact(value: Any, path: str, found: list[str]) -> Any:
    """Replace wrapped secrets (as the mock monitor sees them) by SECRET_MARK, noting their paths."""
    if rpc.is_rpc_secret(value):
        found.append(path or "(all)")
        return SECRET_MARK
    if isinstance(value, dict):
        return {k: redact(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


class _RecordingMocks(pulumi.runtime.Mocks):
    """Outputs = inputs (secrets kept wrapped), so dependent values resolve as written."""

    def __init__(self) -> None:
        self.local = threading.local()

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        self.local.inputs = args.inputs
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class _RecordingMonitor(MockMonitor):
    """The mock monitor, also noting each registration's parent and kind (the mock's
    `new_resource` hook does not see them). Registrations arrive on executor threads."""

    def __init__(self, mocks: _RecordingMocks) -> None:
        super().__init__(mocks)
        self.recorder = mocks
        self.lock = threading.Lock()
        self.declared: list[DeclaredResource] = []

    def RegisterResource(self, request: Any) -> Any:
        self.recorder.local.inputs = {}
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != _STACK_TYPE:
            found: list[str] = []
            inputs = redact(self.recorder.local.inputs, "", found)
            res = DeclaredResource(
                request.type,
                request.name,
                response.urn,
                request.parent,
                bool(request.custom),
                inputs,
                tuple(found),
                str(request.provider or ""),
                bool(request.protect),
                bool(getattr(request, "retainOnDelete", False)),
                tuple(request.dependencies),
                tuple(request.replaceOnChanges),
                bool(request.deleteBeforeReplace),
            )
            with self.lock:
                self.declared.append(res)
        return response


def record_program(program: Callable[[], object], stack_name: str) -> list[DeclaredResource]:
    """Run `program` under the mock runtime and return every resource it registered, sorted by
    URN. Every registration is awaited before this returns."""
    mocks = _RecordingMocks()
    monitor = _RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack_name, preview=False, monitor=monitor)
    pulumi.runtime.test(program)()  # type: ignore[no-untyped-call]
    return sorted(monitor.declared, key=lambda r: r.urn)


def run_offline(
    spec: StackSpec, stack_name: str, served_kinds: frozenset[tuple[str, str]] | None = None
) -> OfflinePreview:
    """Build the stack's Platform under the mock runtime and record what it declares (with
    `served_kinds`, as if the cluster served only those custom resource kinds)."""
    resolved: list[dict[str, Any]] = []

    def program() -> pulumi.Output[None]:
        args = PlatformArgs(spec, stack_name, f"{stack_name}-context", served_kinds)
        platform = Platform(stack_name, args)
        # Outputs derived from resources resolve once the (mock) engine answered their registrations.
        return pulumi.Output.from_input(platform.outputs).apply(lambda v: resolved.append(dict(v)))

    resources = record_program(program, stack_name)
    return OfflinePreview(stack_name, resources, resolved[0] if resolved else {})
