"""Kubeconfig files of the Kubernetes sandbox: one per identity, pointing at the run's API server
and CA. Client certificates and keys are referenced by path (they stay in the run's pki/ folder);
the chaos backend's file carries its ServiceAccount token instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufleet.core.durable_files import write_private


def kubeconfig(
    server: str,
    ca_file: Path,
    user: str,
    *,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    namespace: str | None = None,
    cluster: str = "gpufleet-sandbox",
) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user and one current context (pure)."""
    if (client_cert is None) != (client_key is None):
        raise ValueError("a client certificate needs its key, and a key its certificate")
    if (client_cert is None) == (token is None):
        raise ValueError("give exactly one of a client certificate or a token")
    creds: dict[str, str] = (
        {"client-certificate": str(client_cert), "client-key": str(client_key)}
        if client_cert is not None
        else {"token": str(token)}
    )
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    """Written 0600: the chaos kubeconfig holds a bearer token."""
    write_private(path, yaml.safe_dump(config, sort_keys=False))
    return path
