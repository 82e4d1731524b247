"""Where a fault ledger lives, as text: a file path, or `configmap://<namespace>/<name>` for a
ConfigMap of the cluster the faults go into (gpufleet.chaos.backends.kube_ledger). Shared by the
chaos extension, which reads and writes the ledger, and by what deploys and grants it (the
game-day CronJob, the Kubernetes sandbox's RBAC)."""

from __future__ import annotations

CONFIGMAP_SCHEME = "configmap://"
# The ConfigMap the game-day CronJob's ledger is kept in, in the game-day namespace (the only name
# its Role may read and patch).
LEDGER_CONFIGMAP = "gpufleet-fault-ledger"


def configmap_ledger(namespace: str, name: str = LEDGER_CONFIGMAP) -> str:
    return f"{CONFIGMAP_SCHEME}{namespace}/{name}"


def configmap_location(text: str) -> tuple[str, str] | None:
    """`configmap://<namespace>/<name>` -> (namespace, name); None for a file path; ValueError
    naming what is wrong with a malformed one."""
    if not text.startswith(CONFIGMAP_SCHEME):
        return None
    parts = text[len(CONFIGMAP_SCHEME):].split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"ledger {text!r}: expected {CONFIGMAP_SCHEME}<namespace>/<name>")
    return parts[0], parts[1]
