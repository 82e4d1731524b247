"""The return gate's verdict (pure): a node upgraded (or rolled back) passes only when `gpufleet
inspect`'s checks pass on it at the stack's `gate.inspectLevel`, its performance is at or above
`gate.performanceFloorPercent` of its pool's reference, and the version it reports is the one the
rollout installed (issue 16; docs/fleet-upgrade.md "The gate").

The checks are inspect's own (`gpufleet.fleet.inspect.checks.check_node`), with one change: the
drift pin of the component being upgraded is the version this gate expects (the target, or the old
version after a rollback), not the stack's pin, which the rollout is moving away from.

A gate never passes on what it could not read: an UNKNOWN inspect status fails it (inspect's "never
healthy by default"), and so does a full gate whose performance probe measured nothing.

`perf_gate` judges figures measured apart from the node's reading (the Kubernetes gate's
performance pod, ADR 0083) with inspect's own performance check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpufleet.catalog import XidRule
from gpufleet.core.taxonomy import LadderAction
from gpufleet.fleet.inspect.checks import Context, NodeResult, Pins, Reference, check_figures, check_node
from gpufleet.fleet.inspect.observation import Level, NodeObservation
from gpufleet.fleet.inspect.thresholds import Thresholds
from gpufleet.fleet.upgrade.model import Component


@dataclass(frozen=True)
class GateSetup:
    """What every gate of one rollout checks against."""

    level: Level
    floor_percent: float
    thresholds: Thresholds
    xid_rules: Mapping[int, XidRule]
    component: Component
    pins: Mapping[str, Pins] = field(default_factory=dict)  # pool -> the stack's pins
    references: Mapping[str, Mapping[str, Reference]] = field(default_factory=dict)  # pool -> metric -> ref
    fault_actions: Mapping[str, LadderAction] = field(default_factory=dict)
    # gate.smokeRun: the one-step training run on the node with the job's ranks per node (0: off).
    smoke_ranks: int = 0


@dataclass(frozen=True)
class InspectVerdict:
    passed: bool
    detail: str
    result: NodeResult


def expected_pins(pins: Pins, component: Component, version: str) -> Pins:
    """The stack's pins with the upgraded component's replaced by the version the gate expects."""
    return replace(pins, driver=version) if component is Component.DRIVER else replace(pins, firmware=version)


def inspect_gate(obs: NodeObservation, setup: GateSetup, version: str) -> InspectVerdict:
    """Run inspect's checks on one node's observation (with `obs.perf` filled by the backend's probe
    on a full gate) and say whether the gate passes, and why not."""
    full = setup.level == "full"
    ctx = Context(setup.thresholds, setup.xid_rules,
                  expected_pins(setup.pins.get(obs.pool, Pins()), setup.component, version),
                  setup.references.get(obs.pool, {}), setup.floor_percent, setup.level, setup.fault_actions)
    res = check_node(obs, None, ctx, run_full=full)
    # Drift is a warning in a sweep (the fleet may be mid-rollout); here the upgraded component at
    # another version than the one installed is the reboot's failure.
    drift = [f for f in res.findings if f.name == f"{setup.component.value}-drift"]
    passed = res.status in ("ok", "warn") and not drift
    if passed:
        perf = ", ".join(f"{k.split(':')[1]} {v:.0f}%" for k, v in sorted(res.metrics.items())
                         if k.startswith("perf:"))
        why = [f"inspect {setup.level} {res.status}"]
        if full:
            why.append(f"performance {perf} (floor {setup.floor_percent:g}%)" if perf
                       else "performance not compared: " + "; ".join(s for s in res.skipped if "perf" in s))
        return InspectVerdict(True, "; ".join(why), res)
    failing = [f"{f.code} {f.name} {f.subject}: {f.detail}" for f in res.findings
               if f.severity.value == "fail" or f in drift]
    status = "fail" if drift else res.status
    return InspectVerdict(False, f"inspect {setup.level} {status}: " + "; ".join(failing + list(res.unknown)),
                          res)


def perf_gate(figures: Mapping[str, float], pool: str, setup: GateSetup) -> tuple[bool, str]:
    """The performance floor on figures the backend measured on the node (pure): inspect's
    `check_perf` against the pool's references. No figure fails (never healthy by default); a
    figure without a reference is said, not failed, as in a full inspect."""
    if not figures:
        return False, "performance: the probe measured nothing"
    ctx = Context(setup.thresholds, setup.xid_rules, Pins(), setup.references.get(pool, {}),
                  setup.floor_percent, "full", setup.fault_actions)
    findings, metrics, skipped = check_figures(figures, ctx)
    if findings:
        return False, "performance: " + "; ".join(f"{f.code} {f.name}: {f.detail}" for f in findings)
    shown = [f"{k.split(':')[1]} {figures[k.split(':')[1]]:g} = {v:.0f}%" for k, v in sorted(metrics.items())]
    return True, ("performance " + ", ".join(shown) + f" (floor {setup.floor_percent:g}%)" if shown
                  else "performance not compared: " + "; ".join(skipped))
