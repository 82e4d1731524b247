"""A Kubernetes API client for a kubeconfig file or, inside a pod, the pod's service account. One home
for what the chaos backend, the GPU Operator upgrade driver and inspect's cluster source each need;
the `kubernetes` package is imported only when a client is built (it costs about a second)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The namespace of gpufleet's own objects on a cluster (the Pulumi program's and the sandbox's).
SYSTEM_NAMESPACE = "gpufleet-system"


class KubeClientError(ValueError):
    """No usable credentials: the reason names what was tried."""


def kube_client(kubeconfig: str | Path | None = None, context: str | None = None) -> Any:
    """An ApiClient for `kubeconfig` (None: $KUBECONFIG or ~/.kube/config), else the in-cluster
    service account, without touching the client library's global configuration."""
    from kubernetes import client, config

    try:
        return config.new_client_from_config(config_file=None if kubeconfig is None else str(kubeconfig),
                                             context=context)
    except Exception as e:  # the library raises ConfigException and plain exceptions alike
        first = f"kubeconfig {kubeconfig or '(default)'}: {e}"
    if kubeconfig is not None:
        raise KubeClientError(first)
    try:
        cfg = client.Configuration()
        config.incluster_config.InClusterConfigLoader(
            token_filename=config.incluster_config.SERVICE_TOKEN_FILENAME,
            cert_filename=config.incluster_config.SERVICE_CERT_FILENAME).load_and_set(cfg)
        return client.ApiClient(cfg)
    except Exception as e:
        raise KubeClientError(f"{first}; in-cluster: {e}") from None
