"""Read a Pulumi stack file into a StackSpec, reporting every problem with its path.

A stack file is Pulumi's own format: a top-level `config:` mapping whose keys carry a namespace.
Keys of other namespaces (e.g. `kubernetes:context`) belong to providers and are left alone; every
`gpufleet:` key must be known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError, Problem, format_path
from gpufleet.core.yamlio import safe_load

NAMESPACE = "gpufleet"


_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
    "too_short": "at least",
}


def problems_from_validation(exc: ValidationError) -> list[Problem]:
    """Turn pydantic's errors into path + message pairs, without echoing input values (they may
    be secrets)."""
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        # Discriminated unions add the tag to the location: drop it, the path is the field.
        loc = [p for p in loc if p not in ("static", "karpenter", "sandbox") or p is loc[0]]
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind in _BOUNDS:
            msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "schedule":
            msg = "must be a 5-field cron expression (minute hour day-of-month month day-of-week)"
        if "[key]" in loc:
            # pydantic reports a bad mapping key as <key>.[key]: name the key itself.
            loc = loc[: loc.index("[key]")]
            msg = f"invalid key: {msg}"
        out.append(Problem(format_path(loc), msg))
    return out


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; syntax errors become InputErrors naming line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(str(path), [Problem("(file)", f"cannot read: {e.strerror}")]) from None
    try:
        return safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(str(path), [Problem(where, f"invalid YAML: {problem}")]) from None


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
    try:
        return StackSpec.model_validate(data)
    except ValidationError as e:
        raise InputError(file, problems_from_validation(e)) from None


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
