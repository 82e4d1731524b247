"""Fabric link fault actions: a port down (cable pull), a flapping port, a degraded port."""

from __future__ import annotations

from typing import Any

from chaoslib.types import Configuration, Secrets

from gpufleet.catalog.injection import LinkDegrade, LinkDown, LinkFlap
from gpufleet.chaos import engine

__all__ = ["degrade_link", "flap_link", "inject_fabric_fault", "link_down", "restore_links"]

LINK_KINDS = {"link-down", "link-flap", "link-degrade", "switch-down", "nic-remove"}


def link_down(
    node: str,
    rail: int = 0,
    fault_id: str = "fabric-port-down",
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Take rail `rail` of `node` down: `ip link set <root-side veth peer> down` on the sandbox (a
    real kernel link event), `ip link set <if> down` on the host elsewhere (self-restoring after
    600 s). Rollback: link up."""
    injection = engine.build_injection(LinkDown, rail=rail)
    return engine.inject(configuration, injection, fault_id, node, 0, allow_spare_exhaustion)


def flap_link(
    node: str,
    rail: int = 0,
    period_seconds: float = 4.0,
    count: int = 5,
    fault_id: str = "fabric-link-flap",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Flap rail `rail` of `node`: `count` cycles of down for period/2, up for period/2, in the
    background (bounded: at most count x period seconds). The link is up again at the end and on
    rollback, which also stops the flapper."""
    injection = engine.build_injection(LinkFlap, rail=rail, period_seconds=period_seconds, count=count)
    return engine.inject(configuration, injection, fault_id, node)


def degrade_link(
    node: str,
    rail: int = 0,
    loss_percent: float | None = None,
    rate_mbit: float | None = None,
    fault_id: str = "fabric-link-degraded",
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Degrade rail `rail` of `node`: drop `loss_percent` of incoming packets (nftables
    `numgen random` rule in the node's namespace) and/or cap it at `rate_mbit` (tc tbf). Pure added
    latency is not offered: the netem qdisc is not available on this kernel. Rollback: delete the
    table and the qdisc."""
    injection = engine.build_injection(LinkDegrade, rail=rail, loss_percent=loss_percent, rate_mbit=rate_mbit)
    return engine.inject(configuration, injection, fault_id, node)


def inject_fabric_fault(
    fault_id: str,
    node: str,
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Inject the catalog fabric fault `fault_id` on `node` with the catalog's injection method and
    parameters for the configured backend."""
    return engine.inject_catalog_fault(configuration, fault_id, node, 0, allow_spare_exhaustion)


def restore_links(
    node: str | None = None, configuration: Configuration = None, secrets: Secrets = None
) -> dict[str, Any]:
    """Undo every link fault still in the ledger (on `node` only, if given)."""
    return engine.revert_summary(engine.revert(configuration, LINK_KINDS, node))

