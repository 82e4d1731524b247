"""GPU probes."""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine

__all__ = ["gpu_faults", "injectable_faults"]


def injectable_faults(
    fault_class: str | None = None, configuration: Configuration = None, secrets: Secrets = None
) -> list[dict[str, Any]]:
    """Catalog faults whose injection the configured backend can inject (optionally of one class):
    id, class, XID, injection method and parameters. This is the fault menu, read from the catalog."""
    ctx = engine.context(configuration)
    out = []
    for f in ctx.catalog:
        inj = engine.injection_for(f, ctx.backend_name)
        if inj is None or not ctx.backend_class().can_inject(inj):
            continue
        if fault_class is not None and f.fault_class.value != fault_class:
            continue
        out.append(
            {
                "id": f.id,
                "class": f.fault_class.value,
                "xid": f.xid,
                "method": inj.method,
                "params": inj.params(),
                "alert": f.alert.name if f.alert else None,
            }
        )
    return out


def gpu_faults(
    node: str, configuration: Configuration = None, secrets: Secrets = None
) -> list[dict[str, Any]]:
    """GPUs of `node` that currently report a fault, as the node agent sees them (sandbox backend)."""
    ctx = engine.context(configuration)
    if ctx.backend_name != "sandbox":
        raise ActivityFailed("gpu_faults reads the sandbox node agent; use Prometheus DCGM metrics elsewhere")
    from gpufleet.chaos.backends.sandbox import SandboxBackend
    from gpufleet.chaos.backends.sandbox_undo import agent_request

    b = ctx.backend()
    assert isinstance(b, SandboxBackend)
    n = b.state.node(node)
    if n.agent_socket is None:
        raise ActivityFailed(f"node {node} has no agent socket")
    doc = agent_request(n.agent_socket, b.state.agent_token_file, "GET", "/state")
    return [g for g in (doc or {}).get("gpus", []) if g.get("fault")]
