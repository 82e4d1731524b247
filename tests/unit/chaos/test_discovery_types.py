"""`chaos discover gpufleet` tells the truth: argument types (not `object` everywhere), the
configuration keys the extension reads and the node selectors it accepts."""

from __future__ import annotations

import importlib
from typing import Any, Literal

import pytest
from chaoslib.discovery.discover import discover as chaos_discover

from gpufleet.chaos import ACTIVITY_MODULES
from gpufleet.chaos.discovery import activity_hints, portable
from gpufleet.chaos.settings import KNOWN_KEYS


@pytest.fixture(scope="module")
def discovery() -> dict[str, Any]:
    # the path `chaos discover gpufleet` takes: the distribution's top-level package's discover()
    found: dict[str, Any] = chaos_discover("gpufleet", discover_system=False, download_and_install=False)
    return found


def activity(discovery: dict[str, Any], name: str) -> dict[str, Any]:
    act: dict[str, Any] = next(a for a in discovery["activities"] if a["name"] == name)
    return act


@pytest.mark.parametrize(
    ("hint", "name"),
    [(str, "string"), (int, "integer"), (float, "number"), (bool, "boolean"), (str | None, "string"),
     (list[str], "list"), (list[str] | None, "list"), (dict[str, Any], "mapping"), (int | str, "object"),
     (Literal["a", "b"], "string"), (tuple[int, int], "tuple"), (Any, "object"), (None, "null")],
)
def test_portable_names(hint: Any, name: str) -> None:
    assert portable(hint) == name


def test_every_activity_annotation_resolves() -> None:
    for mod in ACTIVITY_MODULES:
        m = importlib.import_module(mod)
        for name in m.__all__:
            activity_hints(getattr(m, name))  # NameError if an annotation names something not imported


def test_argument_types_are_shown(discovery: dict[str, Any]) -> None:
    inject = activity(discovery, "inject_gpu_fault")
    assert {a["name"]: a["type"] for a in inject["arguments"]} == {
        "fault_id": "string", "node": "string", "gpu": "integer", "allow_spare_exhaustion": "boolean",
        "configuration": "mapping", "secrets": "mapping",
    }
    assert inject["return_type"] == "mapping"
    timeline = {a["name"]: a for a in activity(discovery, "recovery_timeline")["arguments"]}
    assert timeline["wait_for"] == {"name": "wait_for", "default": None, "type": "list"}
    assert timeline["timeout_seconds"]["type"] == "number"


def test_no_argument_is_typed_object(discovery: dict[str, Any]) -> None:
    untyped = [(a["name"], arg["name"]) for a in discovery["activities"] for arg in a["arguments"]
               if arg.get("type", "object") == "object"]
    assert untyped == []
    assert all(a.get("return_type", "object") != "object" for a in discovery["activities"])


def test_configuration_keys_and_node_selectors(discovery: dict[str, Any]) -> None:
    ext = discovery["extension"]
    assert ext["name"] == "gpufleet"
    assert {c["key"] for c in ext["configuration"]} == KNOWN_KEYS
    assert all(c["description"] for c in ext["configuration"])
    syntaxes = [s["syntax"] for s in ext["node_selectors"]]
    assert syntaxes == ["@job:<i>", "@idle:<i>", "@serving:<i>", "<node name>"]
