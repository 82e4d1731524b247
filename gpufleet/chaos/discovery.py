"""What `chaos discover gpufleet` reports: every activity with its argument types, the configuration
keys the extension reads and the node selectors it accepts.

chaoslib's discovery reads `inspect.signature(func)` as is: our modules use postponed annotations
(PEP 563), so it sees strings and reports `object` for every argument; and for real types it knows
only plain classes (`str | None` and `list[str]` are `object` to it). Here the annotations are
resolved with `typing.get_type_hints` and mapped to chaoslib's portable names (`string`, `integer`,
`number`, `boolean`, `list`, `mapping`, ...): an optional argument gets its type's name (its default,
null, says it may be left out); a union of different types stays `object`.
"""

from __future__ import annotations

import importlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chaoslib.discovery.discover import portable_type_name

from gpufleet.chaos.selectors import SELECTORS
from gpufleet.chaos.settings import CONFIG_KEYS

_SEQUENCES: dict[Any, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "set"}


def portable(hint: Any) -> str:
    """chaoslib's portable type name for a resolved annotation."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = {portable(a) for a in typing.get_args(hint) if a is not type(None)}
        return names.pop() if len(names) == 1 else "object"
    if origin is typing.Literal:
        names = {portable(type(a)) for a in typing.get_args(hint)}
        return names.pop() if len(names) == 1 else "object"
    if origin is not None:
        hint = origin
    if hint in _SEQUENCES:
        return _SEQUENCES[hint]
    if isinstance(hint, type) and issubclass(hint, Mapping | dict):
        return "mapping"
    if isinstance(hint, type) and issubclass(hint, Sequence) and hint is not str:
        return "list"
    return str(portable_type_name(hint))


def activity_hints(func: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of an activity (arguments and `return`). Raises NameError when one
    does not resolve: a test runs this over every activity."""
    return typing.get_type_hints(func)


def typed_activities(activities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """chaoslib's discovered activities with each argument's and return value's type resolved."""
    for activity in activities:
        func = getattr(importlib.import_module(activity["mod"]), activity["name"])
        hints = activity_hints(func)
        for arg in activity.get("arguments", []):
            if arg["name"] in hints:
                arg["type"] = portable(hints[arg["name"]])
        if "return" in hints:
            activity["return_type"] = portable(hints["return"])
    return activities


def extension_details() -> dict[str, Any]:
    """What discovery adds under `extension`: configuration keys and node selectors."""
    return {
        "configuration": [{"key": k, "description": d} for k, d in sorted(CONFIG_KEYS.items())],
        "node_selectors": [dict(s) for s in SELECTORS],
    }
