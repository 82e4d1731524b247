"""Each performance metric's reference figure per node pool (pure): the SKU's acceptance figure when
thresholds.yaml gives one (AzNHC's per-SKU floors), else the pool's own median in this sweep (a
metric with no published figure, e.g. the sandbox's TCP bandwidth over veths). The median, not the
mean or the best: one slow node must not drag the reference down, one fast outlier must not fail
the rest (median absolute deviation is the robust spread, used by lemon.py)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from gpufleet.fleet.inspect.checks import Reference
from gpufleet.fleet.inspect.observation import NodeObservation
from gpufleet.fleet.inspect.thresholds import Thresholds


def pool_references(observations: Iterable[NodeObservation], thresholds: Thresholds
                    ) -> dict[str, dict[str, Reference]]:
    """pool -> metric -> reference."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    skus: dict[str, NodeObservation] = {}
    for o in observations:
        skus.setdefault(o.pool, o)
        for metric, v in o.perf.items():
            values[o.pool][metric].append(v)
    out: dict[str, dict[str, Reference]] = {}
    for pool, metrics in values.items():
        sku = thresholds.sku(skus[pool].sku)
        refs: dict[str, Reference] = {}
        for metric, vs in metrics.items():
            published = sku.perf.get(metric)
            if published is not None:
                refs[metric] = Reference(published.value, published.source)
            else:
                refs[metric] = Reference(statistics.median(vs), f"median of pool {pool} ({len(vs)} nodes)")
        out[pool] = refs
    return out
