"""The XID policy: catalog defaults overridden per stack (data, not a hard-coded list), and the
pure decisions the node-health checker and remediators take from it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Fault
from gpufleet.core.errors import Problem
from gpufleet.core.taxonomy import FaultClass, LadderAction

# Classes whose faults take the node out of scheduling; a policy that maps one of their XIDs to an
# action that does not isolate is contradictory.
ISOLATING_CLASSES = frozenset({FaultClass.GPU_FATAL})


@dataclass(frozen=True)
class XidRule:
    xid: int
    fault_id: str | None  # None: an XID the catalog does not know, added by a stack override
    fault_class: FaultClass
    action: LadderAction
    source: str  # "catalog" or "stack override: <reason>"


class OverrideLike(Protocol):
    """A stack's override of one XID: the stack file's `remediation.xidOverrides.<xid>` passes as it
    is (the catalog stays independent of config: it reads these three attributes only)."""

    @property
    def action(self) -> LadderAction: ...
    @property
    def reason(self) -> str: ...
    @property
    def fault_class(self) -> FaultClass | None: ...


@dataclass(frozen=True)
class OverrideSpec:
    """An override given outside a stack file (the node agent's command line, tests)."""

    action: LadderAction
    reason: str
    fault_class: FaultClass | None = None


def parse_overrides(text: str, where: str) -> dict[int, OverrideSpec]:
    """A stack file's remediation.xidOverrides passed on a command line as JSON (camelCase keys),
    how the sandbox hands its stack's policy to the node agent and the health check."""
    try:
        doc = json.loads(text)
        return {
            int(xid): OverrideSpec(LadderAction(o["action"]), str(o["reason"]),
                                   FaultClass(o["faultClass"]) if o.get("faultClass") else None)
            for xid, o in doc.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not an XID override table ({type(e).__name__}: {e})") from None


def xid_policy(
    catalog: Catalog, overrides: Mapping[int, OverrideLike]
) -> tuple[dict[int, XidRule], list[Problem]]:
    """Resolve the XID -> action table; returns it with any conflicts (path under remediation)."""
    table = {
        f.xid: XidRule(f.xid, f.id, f.fault_class, f.action, "catalog")
        for f in catalog
        if f.xid is not None
    }
    problems = []
    for xid, ov in sorted(overrides.items()):
        base = table.get(xid)
        cls = ov.fault_class or (base.fault_class if base else None)
        path = f"remediation.xidOverrides.{xid}"
        if cls is None:
            problems.append(Problem(path, f"XID {xid} is not in the catalog: give faultClass"))
            continue
        if cls in ISOLATING_CLASSES and not ov.action.isolates_node:
            problems.append(
                Problem(
                    path,
                    f"conflict: class {cls.value} isolates the node but action {ov.action.value} "
                    "does not; change the action or the class",
                )
            )
            continue
        if cls not in ISOLATING_CLASSES and ov.fault_class is None and ov.action.isolates_node and base:
            # Allowed (a stricter policy), but say which class it now belongs to.
            cls = FaultClass.GPU_FATAL
        table[xid] = XidRule(xid, base.fault_id if base else None, cls, ov.action,
                             f"stack override: {ov.reason}")
    return table, problems


def isolating_xids(table: Mapping[int, XidRule]) -> list[int]:
    """XIDs whose resolved action takes the node out of scheduling (GPU reset and up): what the
    node-health check reports as a problem (gpufleet.infra.npd_check) and what the Kubernetes chaos
    backend surfaces on a simulated node (gpufleet.chaos.backends.kubernetes)."""
    return sorted(x for x, rule in table.items() if rule.action.isolates_node)


@dataclass(frozen=True)
class Observation:
    """One fault seen on one node (and GPU, when it has one), at a time in seconds."""

    fault_id: str
    node: str
    gpu: int | None
    at: float


def actionable(
    obs: Observation, recent: Sequence[Observation], catalog: Catalog
) -> bool:
    """Whether `obs` should be acted on, given what was seen on the node shortly before.

    A fault marked secondary (XID 45 follows another error) is an echo when any of the faults it is
    secondary to was seen on the same node within its window; a repeat of the same fault on the same
    GPU within the window counts once.
    """
    fault = catalog.get(obs.fault_id)
    if fault.dedup is None:
        return True
    window = fault.dedup.window_seconds
    same_node = [o for o in recent if o.node == obs.node and 0 <= obs.at - o.at <= window and o is not obs]
    if any(o.fault_id == obs.fault_id and o.gpu == obs.gpu for o in same_node):
        return False
    for ref in fault.dedup.secondary_to:
        for o in same_node:
            if o.fault_id == obs.fault_id:
                continue
            if ref == "any" and catalog.get(o.fault_id).xid is not None:
                return False
            if o.fault_id == ref:
                return False
    return True


def escalated_action(fault: Fault, occurrences_in_window: int) -> LadderAction:
    """The ladder rung for a fault that has repeated `occurrences_in_window` times on one node."""
    if fault.escalation and occurrences_in_window >= fault.escalation.repeats:
        return fault.escalation.to
    return fault.action
