"""Reading user files at the edge: YAML with line/column errors, and pydantic errors turned into
`path: message` problems without echoing input values (they may be secrets). One place for every
loader (stacks, catalog, scenarios, promtool fixtures, runbook notes)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.core.errors import InputError, Problem, format_path
from gpufleet.core.yamlio import safe_load

M = TypeVar("M", bound=BaseModel)

_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
    "too_short": "at least",
}


def problems_from_validation(
    exc: ValidationError,
    prefix: Sequence[str | int] = (),
    union_tags: Collection[str] = (),
) -> list[Problem]:
    """Path + message for every pydantic error. `union_tags` are discriminator values pydantic adds
    to locations of tagged unions: they are dropped so the path names the field."""
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        loc = [p for i, p in enumerate(loc) if i == 0 or p not in union_tags]
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind in _BOUNDS and ctx:
            msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
        if "[key]" in loc:
            # pydantic reports a bad mapping key as <key>.[key]: name the key itself.
            loc = loc[: loc.index("[key]")]
            msg = f"invalid key: {msg}"
        out.append(Problem(format_path([*prefix, *loc]), msg))
    return out


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; unreadable files and syntax errors become InputErrors (line, column)."""
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


def validate(model: type[M], data: Any, file: str, union_tags: Collection[str] = ()) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputError(file, problems_from_validation(e, union_tags=union_tags)) from None


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Read a YAML file into a pydantic model; every problem is reported with its path."""
    return validate(model, read_yaml(path), str(path))
