"""The node-health verdict: pure functions from observations and the catalog's policy.

- XIDs: the stack's XID policy (catalog + overrides), deduplicated with the catalog's `actionable`
  (an XID 45 burst after another XID is an echo and never drains), escalated with
  `escalated_action` over the history in the escalation window (e.g. a second XID 79 in a week on
  one node -> replace). Only XIDs after the GPU's last reset / node reboot are current faults.
- DCGM fields: every catalog fault with a `dcgm-field` health check, per GPU; the other vendors'
  exporter series likewise (`exporter-field`).
- Links: every catalog fault of class fabric-link-down with a `link` check, per fabric port.
- Mount: every catalog fault with a `mount` check, when a mount was checked.
- Host: every catalog fault with a `host` check (BMC sensors, EDAC, local disk, port counters).
Status: PROBLEM when a finding's action isolates the node (reset-gpu and above); otherwise UNKNOWN
when a source could not be read (never healthy by default); otherwise OK (milder findings are
reported as warnings).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpufleet.catalog import Catalog, Fault, Observation, XidRule, actionable, escalated_action
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.health.observe import Observations, XidSeen

Status = Literal["ok", "problem", "unknown"]
EXIT_CODES: dict[Status, int] = {"ok": 0, "problem": 1, "unknown": 2}  # node-problem-detector plugins

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}
_UNKNOWN_XID_WINDOW_S = 300.0


@dataclass(frozen=True)
class Finding:
    fault_id: str | None  # None: an XID neither the catalog nor the stack knows
    title: str
    action: LadderAction
    gpu: int | None = None
    device: str | None = None
    xid: int | None = None
    at: float | None = None
    detail: str = ""

    @property
    def where(self) -> str:
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        return self.device or "node"


@dataclass(frozen=True)
class Verdict:
    status: Status
    findings: tuple[Finding, ...]
    unknown: tuple[str, ...]
    message: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def drain(self) -> Finding | None:
        """The finding a drain names: the highest rung on the ladder, earliest first."""
        iso = [f for f in self.findings if f.action.isolates_node]
        if not iso:
            return None
        return min(iso, key=lambda f: (-f.action.rank, f.at if f.at is not None else float("inf")))


def _key(x: XidSeen, rule: XidRule | None) -> str:
    return rule.fault_id if rule and rule.fault_id else f"xid-{x.xid}"


def _reset_at(gpu: int | None, obs: Observations) -> float | None:
    if gpu is None or obs.gpus is None:
        return None
    return next((g.reset_at for g in obs.gpus if g.index == gpu), None)


def _is_new(x: XidSeen, obs: Observations) -> bool:
    reset = _reset_at(x.gpu, obs)
    return reset is None or x.at > reset


def xid_findings(obs: Observations, catalog: Catalog, table: Mapping[int, XidRule]) -> list[Finding]:
    history = sorted(obs.xids, key=lambda x: x.at)
    # Deduplicate over the whole history in arrival order: each event is judged against the ones
    # before it (a burst of identical events at one instant counts once, not zero times).
    acted: list[tuple[XidSeen, str]] = []
    seen: list[Observation] = []
    for x in history:
        rule = table.get(x.xid)
        fid = _key(x, rule)
        o = Observation(fid, obs.node, x.gpu, x.at)
        # A reset / reboot starts afresh: what came before it neither duplicates nor explains a
        # new event (a second XID 79 right after the power-cycle is a new fault).
        reset = _reset_at(x.gpu, obs)
        before = [p for p in seen if reset is None or x.at <= reset or p.at > reset]
        if rule is not None and rule.fault_id is not None:
            ok = actionable(o, before, catalog)
        else:
            ok = not any(p.fault_id == fid and p.gpu == x.gpu and 0 <= x.at - p.at <= _UNKNOWN_XID_WINDOW_S
                         for p in before)
        seen.append(o)
        if ok:
            acted.append((x, fid))
    out = []
    for x, fid in acted:
        if not _is_new(x, obs):
            continue
        rule = table.get(x.xid)
        fault: Fault | None = catalog.get(fid) if rule and rule.fault_id else None
        if rule is None:
            out.append(Finding(None, f"Xid {x.xid} (not in the XID policy)", LadderAction.NONE, x.gpu, None,
                               x.xid, x.at, "unknown XID: add it to the catalog or remediation.xidOverrides"))
            continue
        action, detail = rule.action, rule.source
        if fault is not None and fault.escalation is not None:
            window = fault.escalation.window_hours * 3600.0
            # A GPU reset is the remedy of the reset-gpu rung: occurrences before the GPU's last
            # reset were remedied by it and do not count towards escalating to a reset again. A
            # reset does not remedy what needs a reboot or a replacement, so those keep counting.
            remedied = fault.escalation.to.rank <= LadderAction.RESET_GPU.rank
            n = sum(1 for y, f in acted if f == fid and 0 <= x.at - y.at <= window
                    and (not remedied or _is_new(y, obs)))
            esc = escalated_action(fault, n)
            if esc.rank > action.rank:
                action, detail = esc, f"escalated: {n} occurrences in {fault.escalation.window_hours:g} h"
        title = fault.title if fault else f"Xid {x.xid}"
        out.append(Finding(fault.id if fault else None, title, action, x.gpu, None, x.xid, x.at, detail))
    return out


def field_findings(obs: Observations, catalog: Catalog) -> list[Finding]:
    """DCGM fields (`dcgm-field`) and the other vendors' exporter series (`exporter-field`)."""
    out = []
    for fault in catalog:
        hc = fault.health_check
        if hc is None or hc.threshold is None:
            continue
        for g in obs.gpus or ():
            if hc.source == "dcgm-field" and hc.field_id is not None:
                v, what = g.fields.get(hc.field_id), f"DCGM field {hc.field_id}"
            elif hc.source == "exporter-field" and hc.metric is not None:
                v, what = g.metrics.get(hc.metric), hc.metric
            else:
                continue
            if v is not None and _OPS[hc.op](v, hc.threshold):
                out.append(Finding(fault.id, fault.title, fault.action, g.index, None, fault.xid, None,
                                   f"{what} = {v:g} {hc.op} {hc.threshold:g}"))
    return out


def link_findings(obs: Observations, catalog: Catalog) -> list[Finding]:
    """A port whose device is gone matches the `signal: absent` check (a failed NIC); a port that is
    present but down matches the plain `link` check (port down)."""
    faults = [f for f in catalog if f.health_check is not None and f.health_check.source == "link"
              and f.fault_class is FaultClass.FABRIC_LINK_DOWN]
    out = []
    for link in obs.links or ():
        if link.up:
            continue
        absent = link.state == "absent"
        for f in faults:
            if f.health_check is not None and (f.health_check.signal == "absent") == absent:
                out.append(Finding(f.id, f.title, f.action, None, link.name, None, None,
                                   f"state {link.state}"))
    return out


def host_findings(obs: Observations, catalog: Catalog) -> list[Finding]:
    """Every catalog fault with a `host` check whose signal crosses its threshold."""
    out = []
    for f in catalog:
        hc = f.health_check
        if hc is None or hc.source != "host" or hc.signal is None or hc.threshold is None:
            continue
        v = (obs.host or {}).get(hc.signal)
        if v is not None and _OPS[hc.op](v, hc.threshold):
            out.append(Finding(f.id, f.title, f.action, None, None, None, None,
                               f"{hc.signal} = {v:g} {hc.op} {hc.threshold:g}"))
    return out


def mount_findings(obs: Observations, catalog: Catalog) -> list[Finding]:
    if obs.mount_seconds is None:
        return []
    out = []
    for f in catalog:
        hc = f.health_check
        if hc is None or hc.source != "mount":
            continue
        limit = hc.threshold if hc.threshold is not None else 5.0
        if obs.mount_seconds > limit:
            out.append(Finding(f.id, f.title, f.action, None, obs.mount_path, None, None,
                               f"stat took {obs.mount_seconds:.1f} s (limit {limit:g} s)"))
    return out


def evaluate(obs: Observations, catalog: Catalog, table: Mapping[int, XidRule]) -> Verdict:
    findings = (xid_findings(obs, catalog, table) + field_findings(obs, catalog)
                + link_findings(obs, catalog) + mount_findings(obs, catalog) + host_findings(obs, catalog))
    unknown = list(obs.unknown)
    if obs.gpus is None and not unknown:
        unknown.append("no GPU source")
    if obs.links is None and "links" not in " ".join(unknown):
        unknown.append("fabric links unreadable")
    isolating = [f for f in findings if f.action.isolates_node]
    status: Status = "problem" if isolating else ("unknown" if unknown else "ok")
    return Verdict(status, tuple(findings), tuple(unknown), summary(status, findings, unknown))


def describe(f: Finding) -> str:
    return f"{f.title} ({f.fault_id or 'xid-' + str(f.xid)}, {f.where}) -> {f.action.value}"


def summary(status: Status, findings: list[Finding], unknown: list[str]) -> str:
    """One line (node-problem-detector shows the plugin's first line as the condition message)."""
    iso = [f for f in findings if f.action.isolates_node]
    warn = [f for f in findings if not f.action.isolates_node]
    if status == "problem":
        text = "; ".join(describe(f) for f in sorted(iso, key=lambda f: -f.action.rank))
    elif status == "unknown":
        text = "cannot check: " + "; ".join(unknown)
    else:
        text = "healthy"
    if warn:
        text += " | warnings: " + "; ".join(describe(f) for f in warn[:5])
        if len(warn) > 5:
            text += f"; and {len(warn) - 5} more"
    return text


def drain_reason(f: Finding) -> str:
    """Slurm drain reason naming the fault: `gpufleet: <title> (<fault id>, GPU <i>)`."""
    return f"gpufleet: {f.title} ({f.fault_id or 'xid-' + str(f.xid)}, {f.where})"


def drain_argv(scontrol: str, node: str, f: Finding) -> list[str]:
    return [scontrol, "update", f"nodename={node}", "state=drain", f"reason={drain_reason(f)}"]
