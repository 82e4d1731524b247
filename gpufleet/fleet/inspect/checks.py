"""The inspection checks: pure functions from one node's observation (and the previous sweep's,
for counters that only mean something as a change) to findings with stable codes (codes.py).

A check whose input the source could not read reports UNKNOWN (observation.unknown); a check the
backend cannot observe at all, or that has no threshold for the SKU, is listed as skipped with why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpufleet.catalog import XidRule
from gpufleet.core.taxonomy import LadderAction
from gpufleet.fleet.inspect.codes import CODES, PERF_METRIC_CODES, Severity, spec
from gpufleet.fleet.inspect.observation import GpuObs, Level, NodeObservation, PortObs
from gpufleet.fleet.inspect.thresholds import Sourced, Thresholds

Status = Literal["ok", "warn", "fail", "unknown"]
HEALTH_SOURCE_CODES = frozenset({"GFI004", "GFI005"})


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    fault_id: str | None  # None only for an XID the catalog does not know (a stack override)
    subject: str  # "node", "GPU 3", "port fab0"
    detail: str
    value: float | None = None
    limit: float | None = None


@dataclass(frozen=True)
class Reference:
    """What a performance metric is compared with: the SKU's acceptance figure, or the pool's own."""

    value: float
    source: str


@dataclass(frozen=True)
class Pins:
    driver: str | None = None
    firmware: str | None = None


@dataclass(frozen=True)
class Context:
    thresholds: Thresholds
    xid_rules: Mapping[int, XidRule]
    pins: Pins = Pins()
    references: Mapping[str, Reference] = field(default_factory=dict)  # metric -> reference (the node's pool)
    floor_percent: float = 90.0
    level: Level = "light"
    # Catalog fault -> its action (the health-source check's severity); a fault not in it fails.
    fault_actions: Mapping[str, LadderAction] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeResult:
    node: str
    pool: str
    status: Status
    findings: tuple[Finding, ...]
    skipped: tuple[str, ...]
    unknown: tuple[str, ...]
    # Figures the history trends (history.py): perf % of reference, ECC counts, flaps since last sweep.
    metrics: dict[str, float]
    full: bool  # whether the full (performance) checks ran


def _f(name: str, subject: str, detail: str, value: float | None = None, limit: float | None = None,
       fault_id: str | None = None) -> Finding:
    s = spec(name)
    return Finding(s.code, s.name, s.severity, fault_id or s.fault_id, subject, detail, value, limit)


def check_gpus(obs: NodeObservation, ctx: Context) -> list[Finding]:
    if obs.gpus is None:
        return []
    out: list[Finding] = []
    if len(obs.gpus) < obs.expected_gpus:
        out.append(_f("gpu-count-low", "node", f"{len(obs.gpus)} of {obs.expected_gpus} GPUs visible",
                      len(obs.gpus), obs.expected_gpus))
    for g in obs.gpus:
        if g.health_fault is not None:
            action = ctx.fault_actions.get(g.health_fault)
            isolates = action is None or action.isolates_node
            out.append(_f("gpu-unhealthy" if isolates else "gpu-degraded", f"GPU {g.index}",
                          f"health source holds {g.health_fault} (action "
                          f"{action.value if action else 'unknown to the catalog'})",
                          fault_id=g.health_fault))
        for xid in sorted(set(g.xids)):
            rule = ctx.xid_rules.get(xid)
            if rule is None:
                continue  # an XID in no policy is the node-health check's to report, not a code here
            isolates = rule.action.isolates_node
            out.append(_f("gpu-xid" if isolates else "gpu-xid-contained", f"GPU {g.index}",
                          f"XID {xid} since the last reset (action {rule.action.value})", xid,
                          fault_id=rule.fault_id))
    return out


def check_ecc(obs: NodeObservation, ctx: Context) -> list[Finding]:
    if obs.gpus is None:
        return []
    d = ctx.thresholds.defaults
    out: list[Finding] = []
    rules: tuple[tuple[str, str, Sourced, str], ...] = (
        ("row_remap_pending", "ecc-row-remap-pending", d.ecc_row_remap_pending_max, "row remap pending"),
        ("row_remap_failed", "ecc-row-remap-failed", d.ecc_row_remap_failed_max, "row remap failed"),
        ("uncorrectable_remapped_rows", "ecc-remapped-rows-high", d.ecc_uncorrectable_remapped_rows_max,
         "uncorrectable remapped rows"),
        ("ecc_uncorrectable_volatile", "ecc-uncorrectable", d.ecc_uncorrectable_volatile_max,
         "uncorrectable volatile ECC errors"),
        ("ecc_correctable_volatile", "ecc-correctable-high", d.ecc_correctable_volatile_max,
         "correctable volatile ECC errors"),
    )
    for g in obs.gpus:
        for attr, name, limit, what in rules:
            v = float(getattr(g, attr))
            if v > limit.value:
                detail = f"{what}: {v:g} (limit {limit.value:g})"
                out.append(_f(name, f"GPU {g.index}", detail, v, limit.value))
    return out


def check_pcie(obs: NodeObservation, ctx: Context) -> tuple[list[Finding], list[str]]:
    sku = ctx.thresholds.sku(obs.sku)
    if obs.gpus is None:
        return [], []
    if sku.pcie_gen is None or sku.pcie_width is None:
        return _pcie_against_capability(obs.gpus, obs.sku.value)
    if all(g.pcie_gen is None and g.pcie_width is None for g in obs.gpus):
        return [], [f"pcie: {obs.not_observable.get('pcie', 'the source reports no PCIe link state')}"]
    out: list[Finding] = []
    for g in obs.gpus:
        if g.pcie_width is not None and g.pcie_width < sku.pcie_width.value:
            out.append(_f("pcie-width-low", f"GPU {g.index}", f"PCIe x{g.pcie_width}, expected "
                          f"x{sku.pcie_width.value:g}", g.pcie_width, sku.pcie_width.value))
        if g.pcie_gen is not None and g.pcie_gen < sku.pcie_gen.value:
            out.append(_f("pcie-gen-low", f"GPU {g.index}", f"PCIe Gen{g.pcie_gen}, expected "
                          f"Gen{sku.pcie_gen.value:g}", g.pcie_gen, sku.pcie_gen.value))
    return out, []


def _pcie_against_capability(gpus: Sequence[GpuObs], sku: str) -> tuple[list[Finding], list[str]]:
    """No datasheet pin for the SKU: each device's width against the lanes it reports it supports (a
    link trained narrower than its own capability is degraded whatever the SKU). The generation is
    not judged: a device's current speed drops when idle, and its capability says nothing of the slot."""
    pairs = [(g, g.pcie_width, g.pcie_width_max) for g in gpus]
    if not any(w is not None and m is not None for _, w, m in pairs):
        return [], [f"pcie: no PCIe pin for {sku} in thresholds.yaml, and no device reports "
                    "its link capability"]
    return [_f("pcie-width-low", f"GPU {g.index}", f"PCIe x{w}, the device supports x{m}", w, m)
            for g, w, m in pairs if w is not None and m is not None and w < m], []


def flaps_since(port: PortObs, previous: NodeObservation | None) -> int | None:
    """Lost-carrier events on a port since the previous sweep: carrier changes / 2 (one down/up
    cycle is two changes). None: no previous sweep saw the port. A counter that went backwards
    (the node rebooted) counts from zero."""
    if previous is None or previous.ports is None:
        return None
    before = next((p for p in previous.ports if p.name == port.name), None)
    if before is None:
        return None
    delta = port.carrier_changes - before.carrier_changes
    if delta < 0:
        delta = port.carrier_changes
    return delta // 2


def port_flaps(obs: NodeObservation, previous: NodeObservation | None) -> dict[str, int | None]:
    """flaps_since for every port of the node (computed once per sweep, read by two checks)."""
    return {p.name: flaps_since(p, previous) for p in obs.ports or ()}


def check_fabric(obs: NodeObservation, previous: NodeObservation | None, ctx: Context,
                 flaps_by_port: dict[str, int | None] | None = None) -> list[Finding]:
    if obs.ports is None:
        return []
    flaps_by_port = port_flaps(obs, previous) if flaps_by_port is None else flaps_by_port
    limit = ctx.thresholds.defaults.max_link_flaps.value
    out: list[Finding] = []
    for p in obs.ports:
        subject = f"port {p.name}"
        if p.state == "absent":
            out.append(_f("fabric-port-missing", subject, "port absent"))
            continue
        if p.state != "up":
            out.append(_f("fabric-port-down", subject, f"port {p.state}"))
        if (p.speed_gbps is not None and obs.expected_port_gbps is not None
                and p.speed_gbps < obs.expected_port_gbps):
            out.append(_f("fabric-port-slow", subject, f"{p.speed_gbps:g} Gb/s, stack declares "
                          f"{obs.expected_port_gbps:g}", p.speed_gbps, obs.expected_port_gbps))
        flaps = flaps_by_port.get(p.name)
        if flaps is not None and flaps > limit:
            out.append(_f("fabric-port-flapping", subject, f"{flaps} lost-carrier events since the last "
                          f"sweep (limit {limit:g})", flaps, limit))
    return out


def check_versions(obs: NodeObservation, ctx: Context) -> tuple[list[Finding], list[str], list[str]]:
    """Drift against the stack's pins -> (findings, skipped, unknown)."""
    out: list[Finding] = []
    skipped: list[str] = []
    unknown: list[str] = []
    for what, pin, seen, name in (("driver", ctx.pins.driver, obs.driver_version, "driver-drift"),
                                  ("firmware", ctx.pins.firmware, obs.firmware_version, "firmware-drift")):
        if pin is None:
            skipped.append(f"{what}: the stack pins no {what} version")
        elif seen is None:
            why = obs.not_observable.get(what)
            (skipped if why else unknown).append(f"{what}: {why or 'version not reported by the source'}")
        elif seen != pin:
            out.append(_f(name, "node", f"{what} {seen}, stack pins {pin}"))
    return out, skipped, unknown


def perf_percent(value: float, ref: Reference) -> float:
    return 100.0 * value / ref.value if ref.value > 0 else 0.0


def check_perf(obs: NodeObservation, ctx: Context) -> tuple[list[Finding], dict[str, float], list[str]]:
    """Each result as a % of its reference; under the floor fails. -> (findings, metrics, skipped)."""
    return check_figures(obs.perf, ctx)


def check_figures(perf: Mapping[str, float], ctx: Context
                  ) -> tuple[list[Finding], dict[str, float], list[str]]:
    """check_perf on figures measured apart from an observation (the Kubernetes gate's performance
    pod)."""
    out: list[Finding] = []
    metrics: dict[str, float] = {}
    skipped: list[str] = []
    for metric, value in sorted(perf.items()):
        ref = ctx.references.get(metric)
        if ref is None:
            skipped.append(f"perf {metric}: no reference (SKU table or pool)")
            continue
        pct = perf_percent(value, ref)
        metrics[f"perf:{metric}:pct"] = pct
        if pct < ctx.floor_percent:
            s = CODES[PERF_METRIC_CODES[metric]]
            out.append(Finding(s.code, s.name, s.severity, s.fault_id, "node",
                               f"{metric} {value:g} = {pct:.1f}% of {ref.value:g} ({ref.source}); "
                               f"floor {ctx.floor_percent:g}%", pct, ctx.floor_percent))
    return out, metrics, skipped


def trend_metrics(obs: NodeObservation, previous: NodeObservation | None,
                  flaps_by_port: dict[str, int | None] | None = None) -> dict[str, float]:
    """Figures the history keeps per node: ECC totals and flaps since the last sweep."""
    flaps_by_port = port_flaps(obs, previous) if flaps_by_port is None else flaps_by_port
    out: dict[str, float] = {}
    if obs.gpus is not None:
        out["ecc_correctable"] = sum(g.ecc_correctable_volatile for g in obs.gpus)
        out["ecc_uncorrectable"] = sum(g.ecc_uncorrectable_volatile for g in obs.gpus)
    if obs.ports is not None:
        flaps = [f for f in flaps_by_port.values() if f is not None]
        if flaps:
            out["link_flaps"] = float(sum(flaps))
    out["job_exclusions"] = float(obs.job_exclusions)
    return out


def status_of(findings: list[Finding], unknown: list[str]) -> Status:
    """fail on any failing finding; else unknown when a source could not be read (never healthy by
    default); else warn on a warning; else ok."""
    if any(f.severity is Severity.FAIL for f in findings):
        return "fail"
    if unknown:
        return "unknown"
    if findings:
        return "warn"
    return "ok"


def check_node(obs: NodeObservation, previous: NodeObservation | None, ctx: Context,
               run_full: bool) -> NodeResult:
    """Every check of one node. `run_full`: the plan (plan.py) let the heavy checks run here; the
    performance results count only then."""
    findings: list[Finding] = []
    skipped: list[str] = []
    unknown = list(obs.unknown)
    if obs.gpus is None and not any(u.startswith("gpus") for u in unknown):
        unknown.append("gpus: no GPU source could be read")
    if obs.ports is None and not any(u.startswith("fabric") for u in unknown):
        unknown.append("fabric: port state could not be read")
    findings += check_gpus(obs, ctx)
    findings += check_ecc(obs, ctx)
    # A held fault that a specific check already names on that GPU is reported once, by that check.
    specific = {(f.subject, f.fault_id) for f in findings if f.code not in HEALTH_SOURCE_CODES}
    findings = [f for f in findings
                if f.code not in HEALTH_SOURCE_CODES or (f.subject, f.fault_id) not in specific]
    pcie, pcie_skip = check_pcie(obs, ctx)
    findings += pcie
    skipped += pcie_skip
    flaps = port_flaps(obs, previous)
    findings += check_fabric(obs, previous, ctx, flaps)
    ver, ver_skip, ver_unknown = check_versions(obs, ctx)
    findings += ver
    skipped += ver_skip
    unknown += ver_unknown
    metrics = trend_metrics(obs, previous, flaps)
    if run_full:
        perf, perf_metrics, perf_skip = check_perf(obs, ctx)
        findings += perf
        metrics.update(perf_metrics)
        skipped += perf_skip
    return NodeResult(obs.node, obs.pool, status_of(findings, unknown), tuple(findings), tuple(skipped),
                      tuple(unknown), metrics, run_full)
