"""The local sandbox: a small copy of a GPU training cluster on one Linux machine (docs/sandbox.md).

Public API (imported lazily, so the node agent and training ranks, which live in subpackages,
do not pay for the orchestration modules at start-up):
  up(stack, spec, UpOptions) / down(stack) / status(state) / diagnose()
Other domains use the state file (gpufleet.core.sandbox_contract), never these internals.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SandboxError", "UpOptions", "diagnose", "down", "status", "up"]

_WHERE = {
    "up": "gpufleet.sandbox.up",
    "UpOptions": "gpufleet.sandbox.up",
    "SandboxError": "gpufleet.sandbox.up",
    "down": "gpufleet.sandbox.down",
    "status": "gpufleet.sandbox.status",
    "diagnose": "gpufleet.sandbox.doctor",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufleet.sandbox' has no attribute {name!r}")
