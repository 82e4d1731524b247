"""The local sandbox: a small copy of a GPU training cluster on one Linux machine (docs/sandbox.md).

Public API (imported lazily, so the node agent and training ranks, which live in subpackages,
do not pay for the orchestration modules at start-up):
  up(stack, spec, UpOptions) / down(stack) / status(state) / diagnose()
  kube_up(stack, spec, KubeUpOptions) / kube_down(stack) / kube_status(state) / diagnose_kube():
  the Kubernetes sandbox (gpufleet.sandbox.kube.cluster, docs/kubernetes-sandbox.md)
Other domains use the state file (gpufleet.core.sandbox_contract), never these internals.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "KubeSandboxError",
    "KubeUpOptions",
    "SandboxError",
    "UpOptions",
    "diagnose",
    "diagnose_kube",
    "down",
    "kube_down",
    "kube_status",
    "kube_up",
    "status",
    "up",
]

_WHERE = {
    "up": "gpufleet.sandbox.up",
    "UpOptions": "gpufleet.sandbox.up",
    "SandboxError": "gpufleet.sandbox.up",
    "down": "gpufleet.sandbox.down",
    "status": "gpufleet.sandbox.status",
    "diagnose": "gpufleet.sandbox.doctor",
    "diagnose_kube": "gpufleet.sandbox.doctor",
    "kube_up": "gpufleet.sandbox.kube.cluster",
    "kube_down": "gpufleet.sandbox.kube.cluster",
    "kube_status": "gpufleet.sandbox.kube.cluster",
    "KubeUpOptions": "gpufleet.sandbox.kube.cluster",
    "KubeSandboxError": "gpufleet.sandbox.kube.cluster",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufleet.sandbox' has no attribute {name!r}")
