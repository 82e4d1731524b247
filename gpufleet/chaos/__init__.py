"""gpufleet's Chaos Toolkit extension: GPU, node, fabric, storage and workload faults on the
sandbox, Slurm or Kubernetes, with a durable fault ledger, a blast-radius guard and recovery
verdicts. `chaos discover gpufleet` lists every activity; docs/chaos.md explains the rest."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["ACTIVITY_MODULES", "__version__", "discover"]

DOMAINS = ("gpu", "node", "fabric", "storage", "serving", "workload")
ACTIVITY_MODULES = tuple(f"gpufleet.chaos.{d}.{kind}" for d in DOMAINS for kind in ("actions", "probes"))


def discover(discover_system: bool = True) -> Any:
    """Discover every activity of the extension with its argument types, the configuration keys it
    reads and the node selectors it accepts (under `extension`), and, with discover_system, the
    sandboxes that are up."""
    from chaoslib.discovery import discover_actions, discover_probes, initialize_discovery_result

    from gpufleet.chaos.discovery import extension_details, typed_activities

    result = initialize_discovery_result("gpufleet", __version__, "gpufleet")
    for mod in ACTIVITY_MODULES:
        found = discover_actions(mod) if mod.endswith(".actions") else discover_probes(mod)
        result["activities"].extend(typed_activities(found))
    result["extension"].update(extension_details())
    if discover_system:
        result["system"] = _system()
    return result


def _system() -> dict[str, Any]:
    from gpufleet.core.sandbox_contract import state_root

    root = state_root()
    sandboxes = []
    if root.is_dir():
        for p in sorted(root.glob("*/state.json")):
            sandboxes.append({"stack": p.parent.name, "state_file": str(p)})
    return {"sandboxes": sandboxes}
