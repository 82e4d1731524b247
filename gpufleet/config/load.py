"""Read a Pulumi stack file into a StackSpec, reporting every problem with its path.

A stack file is Pulumi's own format: a top-level `config:` mapping whose keys carry a namespace.
Keys of other namespaces (e.g. `kubernetes:context`) belong to providers and are left alone; every
`gpufleet:` key must be known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import problems_from_validation, read_yaml, validate

__all__ = ["load_named_stack", "load_stack", "parse_stack", "problems_from_validation", "read_yaml",
           "stack_data", "stack_path"]

# Provisioning kinds: pydantic puts the tag of a discriminated union into error locations.
_UNION_TAGS = ("static", "karpenter", "sandbox")

NAMESPACE = "gpufleet"


def stack_data(doc: Any, file: str) -> dict[str, Any]:
    """The `gpufleet:` keys of a stack file, namespace stripped."""
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise InputError(file, [Problem("config", "a stack file needs a top-level `config:` mapping")])
    data: dict[str, Any] = {}
    problems = []
    for key, value in doc["config"].items():
        ns, sep, name = str(key).partition(":")
        if not sep:
            problems.append(Problem(f"config.{key}", "keys need a namespace, e.g. gpufleet:nodePools"))
        elif ns == NAMESPACE:
            data[name] = value
    if problems:
        raise InputError(file, problems)
    return data


def parse_stack(data: dict[str, Any], file: str) -> StackSpec:
    return validate(StackSpec, data, file, _UNION_TAGS)


def load_stack(path: Path | str) -> StackSpec:
    """Load and validate `stacks/Pulumi.<stack>.yaml`. Raises InputError with every problem."""
    p = Path(path)
    return parse_stack(stack_data(read_yaml(p), str(p)), str(p))


def stack_path(name: str, stacks_dir: Path | str = "stacks") -> Path:
    return Path(stacks_dir) / f"Pulumi.{name}.yaml"


def load_named_stack(name: str, stacks_dir: Path | str = "stacks") -> StackSpec:
    path = stack_path(name, stacks_dir)
    if not path.exists():
        known = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml")
                       for p in Path(stacks_dir).glob("Pulumi.*.yaml"))
        problem = Problem("(file)", f"no such stack; known stacks: {', '.join(known) or 'none'}")
        raise InputError(str(path), [problem])
    return load_stack(path)
