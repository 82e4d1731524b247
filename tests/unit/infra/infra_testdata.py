"""Helpers of the infra tests: the shipped stacks and their offline runs (cached: scale-10k takes
seconds). A uniquely named module, not conftest, so test folders never shadow each other."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from gpufleet.config import StackSpec, load_stack
from gpufleet.infra.offline import OfflinePreview, run_offline

ROOT = Path(__file__).resolve().parents[3]
STACK_FILES = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))
STACK_NAMES = [p.name[len("Pulumi.") : -len(".yaml")] for p in STACK_FILES]

_cache: dict[str, tuple[StackSpec, OfflinePreview]] = {}


def shipped(name: str) -> tuple[StackSpec, OfflinePreview]:
    if name not in _cache:
        spec = load_stack(ROOT / "stacks" / f"Pulumi.{name}.yaml")
        _cache[name] = (spec, run_offline(spec, name))
    return _cache[name]


def variant(name: str, change: Callable[[dict[str, Any]], None]) -> StackSpec:
    """A shipped stack with a change applied to its dumped data (re-validated)."""
    spec = load_stack(ROOT / "stacks" / f"Pulumi.{name}.yaml")
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    change(data)
    return StackSpec.model_validate(data)


def load_policies() -> ModuleType:
    """policypack/gpufleet_policies.py (the policy pack is not a package of ours)."""
    if "gpufleet_policies" not in sys.modules:
        path = ROOT / "policypack" / "gpufleet_policies.py"
        spec = importlib.util.spec_from_file_location("gpufleet_policies", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpufleet_policies"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpufleet_policies"]
