"""Prometheus alert rules generated from the catalog (the monitoring-mixin conventions).

Every rule carries `severity`, the fault id and class as labels, a static `summary`, a templated
`description` and a `runbook_url` derived from the alert name (never written by hand). Rules are
grouped by domain: the catalog file the fault came from (gpu, node, fabric, storage, workload), or
the prefix of its class when the catalog was built in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Fault, runbook_url

RUNBOOK_BASE = "https://github.com/gpufleet/gpufleet/blob/main/runbooks"
DOMAINS = ("gpu", "node", "fabric", "storage", "workload")
RULES_FILE = "monitoring/rules/gpufleet.rules.yaml"


def domain_of(fault: Fault, catalog: Catalog) -> str:
    """The domain a fault belongs to: its data file's name, else its class's prefix."""
    stem = Path(catalog.sources.get(fault.id, "")).stem
    if stem in DOMAINS:
        return stem
    return fault.fault_class.value.split("-", 1)[0]


def group_name(domain: str) -> str:
    return f"gpufleet-{domain}"


def alert_rule(fault: Fault, base: str = RUNBOOK_BASE) -> dict[str, Any]:
    """One alerting rule as a plain dict (Prometheus rule-file / PrometheusRule format)."""
    if fault.alert is None:
        raise ValueError(f"fault {fault.id} has no alert (exempt: {fault.exemption})")
    a = fault.alert
    return {
        "alert": a.name,
        "expr": a.expr.strip(),
        "for": a.for_,
        "labels": {
            "severity": fault.severity.value,
            "fault": fault.id,
            "fault_class": fault.fault_class.value,
        },
        "annotations": {
            "summary": a.summary,
            "description": a.description,
            "runbook_url": runbook_url(a.name, base),
        },
    }


def rule_groups(catalog: Catalog, base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """The catalog's alert rules as rule groups (plain dicts), one group per domain, in a fixed
    order; within a group, rules keep catalog order. Deterministic for a given catalog."""
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for fault in catalog:
        if fault.alert is not None:
            by_domain.setdefault(domain_of(fault, catalog), []).append(alert_rule(fault, base))
    order = [d for d in DOMAINS if d in by_domain] + sorted(set(by_domain) - set(DOMAINS))
    return [{"name": group_name(d), "rules": by_domain[d]} for d in order]


def rules_document(catalog: Catalog, base: str = RUNBOOK_BASE) -> dict[str, Any]:
    """A complete Prometheus rule file (`groups:`)."""
    return {"groups": rule_groups(catalog, base)}
