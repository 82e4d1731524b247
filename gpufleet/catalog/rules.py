"""Prometheus alert rules generated from the catalog (the monitoring-mixin conventions).

Every rule carries `severity`, the fault id and class as labels, a static `summary`, a templated
`description` and a `runbook_url` derived from the alert name (never written by hand). Rules are
grouped by domain: the catalog file the fault came from (gpu, node, fabric, storage, workload), or
the prefix of its class when the catalog was built in memory. A fault's recording rules come just
before its alert, so the alert reads the value recorded in the same evaluation.

What differs between clusters is one `RuleSettings` (kubernetes-mixin's config.libsonnet idea): the
runbook base URL, the scrape interval `for:` is debounced against, the fabric devices the stack
declares, its rails per node and link speed. Expressions name them as `<< hcas >>`, `<< rails >>`,
`<< link_bytes >>`, `<< netdevs >>` (jinja2 with PromQL-safe delimiters; `<% if netdevs %>` blocks).
The committed rule file is rendered with the defaults, which are the sandbox stack's (the sandbox's
Prometheus loads that file; a unit test keeps the two equal); the Pulumi program renders each
stack's own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from gpufleet.catalog.exporters import Exporters, Owner, load_exporters
from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Alert, Fault, runbook_url
from gpufleet.catalog.owners import alert_owner, owned_expr, owner_record

RUNBOOK_BASE = "https://github.com/gpufleet/gpufleet/blob/main/runbooks"
DOMAINS = ("gpu", "node", "fabric", "storage", "workload")
RULES_FILE = "monitoring/rules/gpufleet.rules.yaml"
_DURATION = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class RuleSettings:
    """What the rules need to know about the cluster they run on. Defaults: the sandbox stack."""

    runbook_base: str = RUNBOOK_BASE
    scrape_interval_s: float = 2.0  # the slowest scrape interval of the series the rules read
    fabric_devices: tuple[str, ...] = ("fab0",)  # the stack's HCAs (node_infiniband_* `device`)
    fabric_netdevs: str | None = "fab[0-9]+"  # regex of fabric netdevs; None: not declared
    link_speed_gbps: float = 100.0

    def __post_init__(self) -> None:
        if not self.fabric_devices:
            raise ValueError("fabric_devices: declare at least one fabric device")
        if self.scrape_interval_s <= 0:
            raise ValueError("scrape_interval_s must be positive")

    def variables(self) -> dict[str, Any]:
        return {
            "hcas": "|".join(re.escape(d) for d in self.fabric_devices),
            "rails": len(self.fabric_devices),
            "link_bytes": f"{self.link_speed_gbps * 1e9 / 8:.6g}",  # node_exporter: bytes per second
            "netdevs": self.fabric_netdevs,
        }


_ENV = jinja2.Environment(
    variable_start_string="<<", variable_end_string=">>", block_start_string="<%",
    block_end_string="%>", undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    autoescape=False,
)


def render_expr(expr: str, settings: RuleSettings) -> str:
    """An expression with the stack's values in place of its `<< name >>` placeholders."""
    return "\n".join(line for line in _ENV.from_string(expr).render(settings.variables()).strip().splitlines()
                     if line.strip())


def seconds(duration: str) -> float:
    m = _DURATION.fullmatch(duration)
    if not m:
        raise ValueError(f"not a duration: {duration!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def fmt_duration(secs: float) -> str:
    s = math.ceil(secs)
    return f"{s // 60}m" if s % 60 == 0 and s else f"{s}s"


def effective_for(alert: Alert, settings: RuleSettings) -> str:
    """`for:` as written, raised to `min_scrapes` scrape intervals where one scrape must not page."""
    if alert.min_scrapes is None:
        return alert.for_
    floor = alert.min_scrapes * settings.scrape_interval_s
    return alert.for_ if seconds(alert.for_) >= floor else fmt_duration(floor)


def domain_of(fault: Fault, catalog: Catalog) -> str:
    """The domain a fault belongs to: its data file's name, else its class's prefix."""
    stem = Path(catalog.sources.get(fault.id, "")).stem
    if stem in DOMAINS:
        return stem
    return fault.fault_class.value.split("-", 1)[0]


def group_name(domain: str) -> str:
    return f"gpufleet-{domain}"


def alert_rule(fault: Fault, settings: RuleSettings | None = None, owner: Owner | None = None,
               ) -> dict[str, Any]:
    """One alerting rule as a plain dict (Prometheus rule-file / PrometheusRule format); with
    `owner`, the device's workload joined on as `namespace` and `pod` (catalog.owners)."""
    if fault.alert is None:
        raise ValueError(f"fault {fault.id} has no alert (exempt: {fault.exemption})")
    st = settings or RuleSettings()
    a = fault.alert
    expr = render_expr(a.expr, st)
    return {
        "alert": a.name,
        "expr": expr if owner is None else owned_expr(expr, owner),
        "for": effective_for(a, st),
        "labels": {
            "severity": fault.severity.value,
            "fault": fault.id,
            "fault_class": fault.fault_class.value,
        },
        "annotations": {
            "summary": a.summary,
            "description": a.description,
            "runbook_url": runbook_url(a.name, st.runbook_base),
        },
    }


def recording_rules(fault: Fault, settings: RuleSettings | None = None) -> list[dict[str, Any]]:
    st = settings or RuleSettings()
    return [{"record": r.record, "expr": render_expr(r.expr, st)} for r in fault.records]


def alert_owners(catalog: Catalog, exporters: Exporters | None = None) -> dict[str, Owner]:
    """Alert name -> the owner join its rule gets (catalog.owners.alert_owner)."""
    ex = exporters or load_exporters()
    records = {r.record: r.expr for f in catalog for r in f.records}
    out = {}
    for fault in catalog:
        if fault.alert is not None:
            owner = alert_owner(fault.alert.expr, ex, records)
            if owner is not None:
                out[fault.alert.name] = owner
    return out


def rule_groups(catalog: Catalog, settings: RuleSettings | None = None,
                exporters: Exporters | None = None) -> list[dict[str, Any]]:
    """The catalog's rules as rule groups (plain dicts), one group per domain, in a fixed order;
    within a group, rules keep catalog order, a fault's recording rules before its alert, and an
    owner record (catalog.owners) just before the first alert that joins it.
    Deterministic for a given catalog and settings."""
    owners = alert_owners(catalog, exporters)
    recorded: set[str] = set()
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for fault in catalog:
        rules = recording_rules(fault, settings)
        if fault.alert is not None:
            owner = owners.get(fault.alert.name)
            if owner is not None and owner.record not in recorded:
                recorded.add(owner.record)
                rules.append(owner_record(owner))
            rules.append(alert_rule(fault, settings, owner))
        if rules:
            by_domain.setdefault(domain_of(fault, catalog), []).extend(rules)
    order = [d for d in DOMAINS if d in by_domain] + sorted(set(by_domain) - set(DOMAINS))
    return [{"name": group_name(d), "rules": by_domain[d]} for d in order]


def recorded_names(catalog: Catalog, exporters: Exporters | None = None) -> set[str]:
    """Every series the rule file records: the faults' recording rules and the owner records."""
    return {r.record for f in catalog for r in f.records} | {
        o.record for o in alert_owners(catalog, exporters).values()}


def rules_document(catalog: Catalog, settings: RuleSettings | None = None) -> dict[str, Any]:
    """A complete Prometheus rule file (`groups:`)."""
    return {"groups": rule_groups(catalog, settings)}
