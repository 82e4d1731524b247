"""Where a fleet snapshot comes from: the stack alone (node pools; versions, cordons and jobs
unknown) or a file a backend wrote (JSON or YAML, validated with paths)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.config import StackSpec
from gpufleet.core.inputs import read_json, read_yaml, validate
from gpufleet.fleet.upgrade.model import Component, FleetSnapshot, NodeObservation


def snapshot_from_stack(stack: StackSpec, component: Component = Component.DRIVER) -> FleetSnapshot:
    """Every node the stack declares (spares included), healthy, idle, uncordoned, version unknown."""
    nodes = [
        NodeObservation(name=name, pool=pool.name)
        for pool in stack.node_pools
        for name in pool.node_names()
    ]
    return FleetSnapshot(source="stack", component=component, nodes=nodes)


def load_snapshot(path: Path) -> FleetSnapshot:
    """A snapshot file (`.json`, else YAML); every problem is reported with its path."""
    data = read_json(path) if path.suffix == ".json" else read_yaml(path)
    if isinstance(data, dict):
        data = {"source": "file", **data}
    return validate(FleetSnapshot, data, str(path))
