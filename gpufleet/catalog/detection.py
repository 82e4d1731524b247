"""Worst-case detection time of a catalog alert on a stack, and the two routing checks built on the
rules (ADR 0044).

A fault that starts just after a collection is seen, at the latest, after the sum of:

1. the exporter's own collection interval (dcgm-exporter's DCGM_EXPORTER_INTERVAL; 0 for an exporter
   that reads the device when it is scraped), the worst of the exporters the alert reads;
2. the scrape interval of that exporter;
3. the rule evaluation interval (the sample is ingested just after an evaluation);
4. `for:` as rendered for the stack (minScrapes included), rounded up to whole evaluation intervals:
   Prometheus fires at the first evaluation at least `for:` after the one that found it pending;
5. Alertmanager's group_wait for the route of the alert's severity (a production page only: the
   sandbox has no Alertmanager and its game-day measures detection at the first firing ALERTS sample).

Which alerts a class's detect budget binds (`budget_alerts`): the game-day's detection of a fault is the
first of its own alert firing, the node-local health check and the scheduler noticing the node. An
alert binds the budget only where it is that first detection: a critical (paging) alert of a fault of
the class, for the stack's vendors, whose fault has no health check that the stack's node health
check reads (PathSettings.health_sources: the NPD script of a Kubernetes stack reads only XIDs and
fabric ports, infra.npd_check), outside the classes the
scheduler itself notices (a node that stops answering), and not an alert that groups other faults'
alerts (FabricSwitchDown: its ports go down with it and are detected per port first).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

from gpufleet.catalog.exporters import RECORDING_PREFIX, Exporters
from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Fault, HealthCheck
from gpufleet.catalog.promql import metric_names
from gpufleet.catalog.rules import RuleSettings, effective_for, render_expr, seconds
from gpufleet.core.errors import Problem
from gpufleet.core.taxonomy import FaultClass, Severity

# A node that stops answering is noticed by the scheduler (Slurm's SlurmdTimeout, the kubelet's node
# lease) before NodeDown's `for:`; the game-day counts that as the detection (chaos.timeline).
SCHEDULER_DETECTED = frozenset({FaultClass.NODE_CRASH, FaultClass.NODE_HANG})
# Alerts that summarise faults other alerts detect first (the source of an inhibit rule over them).
GROUPING_ALERTS = {"FabricSwitchDown": "its leaf's ports go down with it: FabricPortDown and the link "
                                      "health check detect each port first"}
# Receivers that deliver nowhere: the program's own empty `null` receiver, and the usual name of one.
SILENT_RECEIVERS = frozenset({"null", "blackhole"})


@dataclass(frozen=True)
class ExporterTiming:
    """How stale an exporter's series can be when scraped, and how often it is scraped."""

    collect_s: float | None  # None: the exporter's own interval is not known (not counted, said so)
    collect_source: str
    scrape_s: float
    scrape_source: str


# Every HealthCheck.source (catalog.model): what `gpufleet node-health` reads on a Slurm node and in
# the sandbox.
ALL_HEALTH_SOURCES = frozenset(get_args(HealthCheck.model_fields["source"].annotation))


@dataclass(frozen=True)
class PathSettings:
    """What the detection path of the stack's alerts depends on."""

    exporters: Mapping[str, ExporterTiming]
    evaluation_s: float
    evaluation_source: str
    # Alertmanager's group_wait per severity (a production page); None: no Alertmanager (the sandbox).
    group_wait_s: Mapping[str, tuple[float, str]] | None
    rules: RuleSettings
    vendors: frozenset[str]
    # The health-check sources the stack's node health check reads (catalog HealthCheck.source): a
    # fault whose check reads another source is detected by its alert there.
    health_sources: frozenset[str] = ALL_HEALTH_SOURCES


@dataclass(frozen=True)
class Term:
    what: str
    seconds: float | None  # None: not known, not counted
    source: str

    def text(self) -> str:
        value = "not known, not counted" if self.seconds is None else f"{self.seconds:g} s"
        return f"{self.what} {value} ({self.source})"


@dataclass(frozen=True)
class DetectionPath:
    alert: str
    fault: str
    terms: tuple[Term, ...]

    @property
    def total_s(self) -> float:
        return sum(t.seconds for t in self.terms if t.seconds is not None)

    def text(self) -> str:
        return " + ".join(t.text() for t in self.terms) + f" = {self.total_s:g} s"


def series_read(fault: Fault, catalog: Catalog, settings: RuleSettings) -> set[str]:
    """The exported series the fault's alert reads, through the catalog's recording rules."""
    if fault.alert is None:
        return set()
    records = {r.record: r.expr for f in catalog for r in f.records}
    out: set[str] = set()
    todo, seen = [fault.alert.expr], set()
    while todo:
        for name in metric_names(render_expr(todo.pop(), settings)):
            if name in seen:
                continue
            seen.add(name)
            if name in records:
                todo.append(records[name])
            elif not name.startswith(RECORDING_PREFIX):
                out.add(name)
    return out


def detection_path(fault: Fault, catalog: Catalog, exporters: Exporters, st: PathSettings) -> DetectionPath:
    """The worst-case time from a fault to its alert firing (and, on a production stack, to the
    notification leaving Alertmanager), term by term."""
    if fault.alert is None:
        raise ValueError(f"fault {fault.id} has no alert")
    worst: tuple[float, str, ExporterTiming] | None = None
    for name in sorted(series_read(fault, catalog, st.rules)):
        found = exporters.producer(name)
        if found is None:
            raise ValueError(f"{fault.alert.name} reads {name}, which no exporter declares")
        ex_name, ex = found
        if ex.vendor is not None and ex.vendor not in st.vendors:
            continue  # another vendor's exporter: not deployed on this stack
        timing = st.exporters.get(ex_name)
        if timing is None:
            continue  # not run where this stack runs (the sandbox's own exporters: can_fire)
        cost = (timing.collect_s or 0.0) + timing.scrape_s
        if worst is None or cost > worst[0]:
            worst = (cost, ex_name, timing)
    terms: list[Term] = []
    if worst is not None:
        _, ex_name, timing = worst
        terms.append(Term(f"{ex_name} collection", timing.collect_s, timing.collect_source))
        terms.append(Term(f"{ex_name} scrape", timing.scrape_s, timing.scrape_source))
    ev = st.evaluation_s
    terms.append(Term("rule evaluation", ev, st.evaluation_source))
    rendered = effective_for(fault.alert, st.rules)
    held = math.ceil(seconds(rendered) / ev - 1e-9) * ev
    why = f"for: {rendered}" + (f", minScrapes {fault.alert.min_scrapes}" if fault.alert.min_scrapes else "")
    terms.append(Term("for", held, f"{why}, in whole evaluation intervals"))
    if st.group_wait_s is not None:
        wait, source = st.group_wait_s[fault.severity.value]
        terms.append(Term("Alertmanager group_wait", wait, source))
    return DetectionPath(fault.alert.name, fault.id, tuple(terms))


def can_fire(fault: Fault, catalog: Catalog, exporters: Exporters, st: PathSettings) -> bool:
    """Whether some series the fault's alert reads comes from an exporter that runs where the stack
    runs (every exporter on a cluster, the operator's included; on a sandbox only those it serves,
    `sandbox: true` in exporters.yaml). An alert none of whose series is produced never fires, so it
    detects nothing and times nothing."""
    for name in series_read(fault, catalog, st.rules):
        found = exporters.producer(name)
        if found is not None and found[0] in st.exporters and (
                found[1].vendor is None or found[1].vendor in st.vendors):
            return True
    return False


def budget_alerts(catalog: Catalog, cls: FaultClass, vendors: frozenset[str],
                  health_sources: frozenset[str] = ALL_HEALTH_SOURCES) -> list[Fault]:
    """The faults whose alert is the first detection of a fault of `cls` (see the module's doc);
    a health check counts where the stack's node health check reads its source."""
    if cls in SCHEDULER_DETECTED:
        return []
    return [
        f for f in catalog.of_class(cls)
        if f.alert is not None and f.severity == Severity.CRITICAL
        and (f.health_check is None or f.health_check.source not in health_sources)
        and (f.vendor is None or f.vendor in vendors) and f.alert.name not in GROUPING_ALERTS
    ]


def budget_problems(catalog: Catalog, exporters: Exporters, detect_budgets: Mapping[FaultClass, float],
                    st: PathSettings, fault_budgets: Mapping[str, float] | None = None,
                    where: str = "slos") -> list[Problem]:
    """A problem per (class, alert) whose worst-case detection path is longer than its detect
    budget (the fault's own in `fault_budgets`, `<where>.faultBudgets.<id>.detectSeconds`, else its
    class's), naming each term of the sum; and per `fault_budgets` entry that no budgeted alert
    uses (every key changes a verdict or is refused)."""
    own = dict(fault_budgets or {})
    out = []
    used: set[str] = set()
    for cls, budget in detect_budgets.items():
        for fault in budget_alerts(catalog, cls, st.vendors, st.health_sources):
            if not can_fire(fault, catalog, exporters, st):
                continue
            path = detection_path(fault, catalog, exporters, st)
            limit, at = budget, f"{where}.budgets.{cls.value}.detectSeconds"
            if fault.id in own:
                used.add(fault.id)
                limit, at = own[fault.id], f"{where}.faultBudgets.{fault.id}.detectSeconds"
            if path.total_s > limit:
                out.append(Problem(
                    at, f"{limit:g} s is less than the worst-case detection of {path.alert} "
                        f"(fault {path.fault}): {path.text()}"))
    for fid in sorted(set(own) - used):
        at = f"{where}.faultBudgets.{fid}"
        if fid not in {f.id for f in catalog}:
            out.append(Problem(at, "not a fault of the catalog"))
            continue
        fault = catalog.get(fid)
        if fault.fault_class not in detect_budgets:
            out.append(Problem(at, f"its class {fault.fault_class.value} has no budget in {where}.budgets"))
        else:
            budgeted = fault in budget_alerts(catalog, fault.fault_class, st.vendors, st.health_sources)
            why = ("no exporter it reads runs where this stack runs" if budgeted
                   else unbudgeted_reason(fault, st.vendors, st.health_sources))
            out.append(Problem(at, f"{fid}'s alert does not time its detection on this stack ({why}): "
                                   "drop the key"))
    return out


def unbudgeted_reason(fault: Fault, vendors: frozenset[str],
                      health_sources: frozenset[str] = ALL_HEALTH_SOURCES) -> str:
    """Why a fault's alert binds no detect budget (budget_alerts)."""
    if fault.alert is None:
        return "it has no alert"
    if fault.fault_class in SCHEDULER_DETECTED:
        return "the scheduler notices its class first"
    if fault.severity != Severity.CRITICAL:
        return f"its alert is {fault.severity.value}, not a page"
    if fault.health_check is not None and fault.health_check.source in health_sources:
        return "the node health check detects it first"
    if fault.vendor is not None and fault.vendor not in vendors:
        return f"the stack has no {fault.vendor} accelerators"
    return GROUPING_ALERTS.get(fault.alert.name, "it is not budgeted")


def used_severities(rule_groups: Iterable[Mapping[str, object]]) -> dict[str, list[str]]:
    """Severity -> the alerts (rendered rule groups) that carry it."""
    out: dict[str, list[str]] = {}
    for g in rule_groups:
        rules = g.get("rules", [])
        assert isinstance(rules, list)
        for r in rules:
            if "alert" in r:
                out.setdefault(r["labels"]["severity"], []).append(r["alert"])
    return out


def routing_problems(used: Mapping[str, list[str]], routes: Iterable[tuple[str, str]],
                     not_paged: Iterable[str], where: str = "monitoring") -> list[Problem]:
    """A problem per severity the rules use that no route sends to a real receiver (`routes`:
    (severity, receiver) in order; a null or blackhole receiver delivers nowhere), unless the stack
    lists it in `notPagedSeverities`; and per severity both routed and listed there."""
    routed = {sev: rcv for sev, rcv in reversed(list(routes))}  # the first matching route wins
    quiet = set(not_paged)
    out = []
    for sev in sorted(used):
        alerts = used[sev]
        delivered = sev in routed and routed[sev] not in SILENT_RECEIVERS
        if not delivered and sev not in quiet:
            how = f"routed to {routed[sev]!r}, which delivers nowhere" if sev in routed else "has no route"
            shown = ", ".join(alerts[:8]) + (f" and {len(alerts) - 8} more" if len(alerts) > 8 else "")
            out.append(Problem(
                f"{where}.alertRoutes",
                f"severity {sev} {how}, yet the rules use it ({shown}): route it to a receiver, or "
                f"list it in {where}.notPagedSeverities to say it pages no one"))
    for sev in sorted(quiet):
        if sev in routed and routed[sev] not in SILENT_RECEIVERS:
            out.append(Problem(f"{where}.notPagedSeverities",
                               f"{sev} is listed as not paged but routed to {routed[sev]!r}"))
    return out
