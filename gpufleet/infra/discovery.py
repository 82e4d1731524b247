"""Which custom resource kinds a cluster serves: read once by the entry point when the stack's
charts are disabled (`gpufleet:charts.source: disabled`), so the program leaves out, and says so, a custom
resource whose CRD nothing installs instead of failing `pulumi up` on it.

`served_kinds` is pure (CRD objects -> (apiVersion, kind) pairs); `read_served_kinds` is the thin
read through the official Kubernetes client, with the kubeconfig and context the stack's
Kubernetes provider uses (KUBECONFIG, `kubernetes:context`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def served_kinds(crds: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """(apiVersion, kind) of every served version of every Established CRD."""
    out: set[tuple[str, str]] = set()
    for crd in crds:
        if not established(crd):
            continue
        spec = crd.get("spec") or {}
        kind = (spec.get("names") or {}).get("kind")
        for version in spec.get("versions") or []:
            if version.get("served") and kind:
                out.add((f"{spec.get('group')}/{version.get('name')}", str(kind)))
    return frozenset(out)


class DiscoveryError(RuntimeError):
    """The cluster's CRDs could not be read; the message says which context and why."""


def read_served_kinds(context: str | None) -> frozenset[tuple[str, str]]:
    """The kinds the cluster of kubeconfig context `context` (None: the current one) serves."""
    from kubernetes import client, config  # the program imports it only when it needs it

    try:
        api = config.new_client_from_config(context=context)
        with api:
            items = client.ApiextensionsV1Api(api).list_custom_resource_definition().items
            crds = [api.sanitize_for_serialization(item) for item in items]
    except Exception as e:  # config, TLS, HTTP: all mean the same thing to the caller
        where = f"context {context!r}" if context else "the kubeconfig's current context"
        raise DiscoveryError(f"cannot list the CRDs of {where}: {e}") from None
    return served_kinds(crds)
