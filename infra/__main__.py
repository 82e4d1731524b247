"""Pulumi entry point: `pulumi preview/up -s <stack>` runs this.

The only place that reads `pulumi.Config` (STYLE.md point 5). It collects the `gpufleet:` keys of
the selected stack, validates them into a StackSpec with the same parser `gpufleet validate` uses
(all problems at once, with paths), and builds the Platform. Pulumi hands `secure:` values over
decrypted; the components wrap them again as Pulumi secrets, so they stay encrypted in the state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env, is_config_secret

from gpufleet.config import StackSpec, parse_stack
from gpufleet.config.load import NAMESPACE
from gpufleet.config.model import ChartSource, decrypted_by_pulumi
from gpufleet.core.errors import InputError
from gpufleet.infra import Platform, PlatformArgs
from gpufleet.infra.charts import CHARTS, local_archives
from gpufleet.infra.discovery import DiscoveryError, read_served_kinds


def configured_keys() -> set[str]:
    """Every `gpufleet:` key set on the stack (the engine passes them to the program)."""
    keys = set(CONFIG.get()) | set(get_config_env())
    return {k.split(":", 1)[1] for k in keys if k.startswith(f"{NAMESPACE}:")}


def read_stack_config() -> dict[str, Any]:
    config = pulumi.Config(NAMESPACE)
    known = {f.alias or name for name, f in StackSpec.model_fields.items()}
    data: dict[str, Any] = {}
    for key in sorted(configured_keys() | known):
        try:
            value = config.get_object(key)
        except pulumi.ConfigTypeError:
            value = config.get(key)  # a plain scalar: the model reports what is wrong with it
        if value is not None:
            data[key] = value
    return data


def main() -> None:
    stack = pulumi.get_stack()
    file = f"stacks/Pulumi.{stack}.yaml"
    data = read_stack_config()
    # Keys Pulumi decrypted were `secure:` in the stack file; a plain secret anywhere else is a
    # plain-text credential and validation refuses it outside the sandbox.
    decrypted = frozenset(k for k in data if is_config_secret(f"{NAMESPACE}:{k}"))
    try:
        with decrypted_by_pulumi(decrypted):
            spec = parse_stack(data, file)
    except InputError as e:
        # Same lines `gpufleet validate` prints; the Pulumi engine shows them as the error.
        raise pulumi.RunError(e.render()) from None
    if spec.sandbox is not None and spec.cluster.environment.value == "sandbox":
        pulumi.log.warn(
            "this is the sandbox stack: its node patches address nodes named "
            f"{', '.join(p.node_names()[0] for p in spec.node_pools)}... (a small dev cluster such as kind)"
        )
    context = pulumi.Config("kubernetes").get("context")
    missing = sorted(a for a in local_archives(spec.charts, sorted(CHARTS)).values() if not Path(a).is_file())
    if missing:
        raise pulumi.RunError(
            f"{file}: charts.localDir: {len(missing)} chart archive(s) missing: " + ", ".join(missing)
        )
    served = None
    if spec.charts.source is ChartSource.DISABLED:
        # No chart installs a CRD: ask the cluster which custom resources it can take.
        try:
            served = read_served_kinds(context)
        except DiscoveryError as e:
            raise pulumi.RunError(str(e)) from None
    platform = Platform(stack, PlatformArgs(spec, stack, context, served))
    for name, value in platform.outputs.items():
        pulumi.export(name, value)


if __name__ == "__main__":
    main()
