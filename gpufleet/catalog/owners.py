"""The workload that holds a device, on that device's alerts (ADR 0048; pure).

A device exporter labels a device's series with the pod that holds it only while the pod runs
(exporters.yaml `owner`), and a fatal fault usually ends the pod: read live, the owner would vanish
from an alert minutes after it fired, and Alertmanager would see a new alert. So a recording rule
per exporter keeps the last owner it saw, as `namespace` and `pod`, with the time it last saw it:

- while a pod holds the device: that pod (one, if the exporter names several);
- after, while the device still reports: the last owner, for OWNER_HOLD_S;
- while the device reports nothing at all (fallen off the bus, node down): the last owner, for
  VANISHED_HOLD_S, which bounds what a replaced device leaves behind.

An alert that identifies one device (its outer `by (...)` holds the exporter's keys) is joined with
it, and also kept without it (`or on`), so a device with no known owner still alerts: the join adds
labels, it never drops an alert and never delays one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpufleet.catalog.exporters import Exporters, Owner, series_sources

OWNER_LABELS = ("namespace", "pod")
# An hour covers the alert's first notifications and the triage that reads them; longer would name
# an old job on an idle GPU's later alerts.
OWNER_HOLD_S = 3600
VANISHED_HOLD_S = 7 * 86400
_OUTER_BY = re.compile(r"^\s*\(?\s*(?:max|min|sum|avg|count|group)\s+by\s*\(([^()]*)\)")


def outer_by(expr: str) -> list[str] | None:
    """The labels of the expression's outermost `<agg> by (...)`, or None when it starts otherwise."""
    m = _OUTER_BY.match(expr)
    return None if m is None else [x.strip() for x in m.group(1).split(",") if x.strip()]


def alert_owner(expr: str, exporters: Exporters, records: Mapping[str, str]) -> Owner | None:
    """The owner join an alert gets: that of the one exporter whose series it reads (following the
    catalog's recording rules) when its result identifies one device of that exporter; else None."""
    by = outer_by(expr)
    if by is None:
        return None
    read = {src for _, src, _ in series_sources(expr, exporters, dict(records))}
    owners = [ex.owner for name, ex in exporters.exporters.items()
              if name in read and ex.owner is not None and set(ex.owner.keys) <= set(by)]
    return owners[0] if len(owners) == 1 else None


def owner_record(owner: Owner) -> dict[str, Any]:
    """The recording rule that keeps the device's last owner (module docstring)."""
    keys = ", ".join(owner.keys)
    rec = owner.record
    now = (
        f"group by ({keys}, {owner.namespace}, {owner.pod}) ({owner.series}{{{owner.pod}!=\"\"}})"
    )
    renamed = (
        f'label_replace(label_replace({now}, "namespace", "$1", "{owner.namespace}", "(.*)"), '
        f'"pod", "$1", "{owner.pod}", "(.*)")'
    )
    expr = "\n".join([
        f"time() + 0 * topk by ({keys}) (1, group by ({keys}, namespace, pod) ({renamed}))",
        f"or on ({keys}) ({rec} > time() - {OWNER_HOLD_S})",
        f"or on ({keys}) (({rec} > time() - {VANISHED_HOLD_S}) unless on ({keys}) {owner.series})",
    ])
    return {"record": rec, "expr": expr}


def owned_expr(expr: str, owner: Owner) -> str:
    """The alert's expression with its device's owner joined on, the alert kept where none is known."""
    keys = ", ".join(owner.keys)
    labels = ", ".join(OWNER_LABELS)
    return (
        f"(\n{_indent(expr)}\n)\n"
        f"* on ({keys}) group_left ({labels}) (0 * {owner.record} + 1)\n"
        f"or on ({keys}) (\n{_indent(expr)}\n)"
    )


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
