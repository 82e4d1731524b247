"""Small helpers every component uses: options for children, secrets, our own namespace."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from gpufleet.config import Secret
from gpufleet.core import kube_client

# Where gpufleet's own objects (NCCL environment, game-day copy of the stack, inspect results) live.
SYSTEM_NAMESPACE = kube_client.SYSTEM_NAMESPACE
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpufleet"}

# In an offline preview a `secure:` value is still Pulumi ciphertext (only the Pulumi CLI can
# decrypt it); it is replaced by this marker, and stays a secret either way.
OFFLINE_SECRET = "<pulumi-decrypts-at-deploy-time>"


def child(parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on))


def secret_input(secret: Secret) -> pulumi.Output[str]:
    """A stack secret as a Pulumi secret output. Under `pulumi up` the entry point receives the
    decrypted value (a plain Secret); it is re-wrapped here so it is encrypted in the state and
    masked in every diff."""
    value = secret.plain if secret.plain is not None else OFFLINE_SECRET
    return pulumi.Output.secret(value)
