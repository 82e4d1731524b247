"""Fabric probes."""

from __future__ import annotations

from pathlib import Path

from chaoslib.exceptions import ActivityFailed, InvalidActivity
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine

__all__ = ["link_state"]


def link_state(node: str, rail: int = 0, configuration: Configuration = None, secrets: Secrets = None) -> str:
    """Operational state ("up", "down", ...) of rail `rail` of `node`, read from the kernel
    (/sys/class/net/<veth peer>/operstate; sandbox backend)."""
    ctx = engine.context(configuration)
    if ctx.backend_name != "sandbox":
        raise ActivityFailed("link_state reads sandbox veth peers; use node_exporter metrics elsewhere")
    from gpufleet.chaos.backends.sandbox import SandboxBackend

    b = ctx.backend()
    assert isinstance(b, SandboxBackend)
    for link in b.state.node(node).fabric:
        if link.rail == rail:
            try:
                return Path(f"/sys/class/net/{link.peer}/operstate").read_text().strip()
            except OSError as e:
                raise ActivityFailed(f"cannot read state of {link.peer}: {e}") from None
    raise InvalidActivity(f"node {node} has no rail {rail}")
