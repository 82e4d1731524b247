"""Cluster and node probes."""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine, prometheus

__all__ = ["blast_radius_allows", "cluster_healthy", "nodes_unavailable"]


def cluster_healthy(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """True when every node is schedulable and no critical alert fires. A source that cannot be read
    fails the probe (ActivityFailed): an unknown state is never reported healthy."""
    ctx = engine.context(configuration)
    b = ctx.backend()
    states = b.node_states()
    if not states:
        raise ActivityFailed("the scheduler reported no nodes")
    bad = sorted(n for n, o in states.items() if not o.schedulable)
    url = b.prometheus_url()
    if url is None:
        raise ActivityFailed("no Prometheus URL (gpufleet_prometheus_url): alert state unknown")
    critical = sorted(
        {
            a["labels"].get("alertname", "?")
            for a in prometheus.firing_alerts(url)
            if a.get("labels", {}).get("severity") == "critical"
        }
    )
    if bad or critical:
        import logging

        logging.getLogger("chaostoolkit").warning(
            "cluster not healthy: unschedulable %s, critical alerts firing %s", bad, critical
        )
    return not bad and not critical


def nodes_unavailable(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Nodes that are not schedulable now, with state and reason."""
    b = engine.context(configuration).backend()
    return {
        n: {"state": o.state, "reason": o.reason} for n, o in b.node_states().items() if not o.schedulable
    }


def blast_radius_allows(
    nodes: list[str],
    allow_spare_exhaustion: bool = False,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> bool:
    """Would the blast-radius guard let `nodes` be taken down now (given nodes already down and
    faults in the ledger)? False when it would refuse; the reasons are logged."""
    ctx = engine.context(configuration)
    reasons = engine.check_blast_radius(ctx, ctx.backend(), set(nodes), allow_spare_exhaustion)
    if reasons:
        import logging

        logging.getLogger("chaostoolkit").info("blast-radius guard would refuse: %s", "; ".join(reasons))
    return not reasons
