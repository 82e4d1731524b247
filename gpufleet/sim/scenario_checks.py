"""Which scenario keys would change nothing (pure): a silently ignored input is an error with its
path (STYLE.md point 7; issue 18). Run by `resolve` once the inputs are resolved, because whether a
key matters depends on the stack, the catalog and the game-day report too (a per-class key for a
class with no rate, a repair time for a rung no fault reaches, a detection time the report
measured...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.config.model import SpareMode, StackSpec
from gpufleet.core.errors import Problem
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sim.gameday_input import Measured
from gpufleet.sim.params import ClassHandling, FaultKind
from gpufleet.sim.scenario import Scenario

STORE = (FaultClass.STORAGE_OUTAGE, FaultClass.STORAGE_DEGRADED)
NO_RATE = "no fault of this class has a rate here, so it would change nothing"


@dataclass(frozen=True)
class Resolved:
    """What the checks need besides the scenario: the resolved fault kinds and class handling,
    the stack, the game-day measurements, and the resolved spare count, mode and horizon."""

    stack: StackSpec
    kinds: list[FaultKind]
    handling: Mapping[FaultClass, ClassHandling]
    measured: Mapping[FaultClass, Measured]
    spares: int
    spare_mode: SpareMode
    days: float
    report_file: str = ""

    @property
    def rated(self) -> set[FaultClass]:
        return {k.fault_class for k in self.kinds if k.per_node_hour > 0}

    def node_level(self, cls: FaultClass) -> bool:
        """Faults of this class hit one node and take the ladder (their action matters)."""
        return self.handling[cls].domain == "node" and cls not in STORE

    def rungs(self) -> set[LadderAction]:
        """Every ladder rung a rated node-level fault can reach: its action, its escalation, and
        the climbs of the stack's attempt caps (after `resetGpu` resets a reboot, after
        `rebootNode` reboots a replacement; a cap of 0 skips the rung)."""
        caps = self.stack.remediation.attempt_caps
        out: set[LadderAction] = set()
        for k in self.kinds:
            if k.per_node_hour <= 0 or not self.node_level(k.fault_class):
                continue
            out.update(a for a in (k.action, k.escalate_to) if a is not None)
        if LadderAction.RESET_GPU in out:
            out.add(LadderAction.REBOOT_NODE)
            if caps.reset_gpu == 0:
                out.discard(LadderAction.RESET_GPU)
        if LadderAction.REBOOT_NODE in out:
            out.add(LadderAction.REPLACE)
            if caps.reboot_node == 0:
                out.discard(LadderAction.REBOOT_NODE)
        return out

    def isolates(self) -> bool:
        """Some fault can take a node out of service (a rung that isolates, or a shared domain)."""
        return bool({a for a in self.rungs() if a.isolates_node}) or any(
            self.handling[c].domain in ("leaf", "rack") for c in self.rated if c not in STORE)

    def measured_all(self, cls: FaultClass, part: int) -> bool:
        """The report measured this part (0 detect, 1 isolate) in every experiment of the class."""
        m = self.measured.get(cls)
        return m is not None and bool(m.samples) and all(s[part] is not None for s in m.samples)

    def detect_used(self, cls: FaultClass) -> bool:
        """The class's detection time is waited for: a node or domain fault always, a store fault
        only when its action stops the job."""
        if cls in STORE:
            return any(k.fault_class is cls and k.per_node_hour > 0 and k.action is not LadderAction.NONE
                       for k in self.kinds)
        return cls in self.rated


def detection_mode(stack: StackSpec, sc: Scenario, cls: FaultClass) -> str:
    return sc.detection.mode.get(cls) or stack.remediation.detection.get(cls) or "passive"


def unused_keys(sc: Scenario, r: Resolved) -> list[Problem]:
    """Every scenario key that would change nothing here, with its path."""
    out: list[Problem] = []
    rated = r.rated
    stack = r.stack
    monitor_only = stack.remediation.mode == "monitor-only"
    report = f"the game-day report {r.report_file}" if r.report_file else "the game-day report"
    for cls, ov in sc.rates.items():
        if not ov.has_rate and cls not in rated:
            out.append(Problem(f"rates.{cls.value}.action", f"{NO_RATE}; give a rate too"))
        elif ov.action is not None and cls not in STORE and not r.node_level(cls):
            out.append(Problem(f"rates.{cls.value}.action",
                               f"this class takes down a whole {r.handling[cls].domain}: every node "
                               "of it is out for detect + isolate + domainOutageHours, whatever the "
                               "action"))
        elif cls in STORE and ov.action is not None and ov.action.isolates_node:
            out.append(Problem(f"rates.{cls.value}.action",
                               "a store fault isolates no node: its action is `none` (the job trains "
                               "on) or `restart-job` (it stops and waits for the store)"))
        if not ov.has_rate and "source" in ov.model_fields_set:
            out.append(Problem(f"rates.{cls.value}.source", "a source goes with a rate; give one or "
                                                            "drop the key"))
    for key, table in (("weibullShape", sc.weibull_shape), ("domains", sc.domains),
                       ("domainOutageHours", sc.domain_outage_hours),
                       ("isolateSeconds", sc.isolate_seconds),
                       ("detection.mode", sc.detection.mode),
                       ("detection.activeSeconds", sc.detection.active_seconds)):
        for cls in table:
            if cls not in rated:
                out.append(Problem(f"{key}.{cls.value}", NO_RATE))
    for cls in sc.weibull_shape:
        if cls in rated and not r.node_level(cls):
            out.append(Problem(f"weibullShape.{cls.value}",
                               "a shared-domain or store fault arrives at the fleet level (Poisson); "
                               "a per-node Weibull shape does not apply"))
    for cls, dom in sc.domains.items():
        if cls in STORE and dom != "cluster":
            out.append(Problem(f"domains.{cls.value}",
                               "the checkpoint store serves the whole job: its domain is `cluster`"))
    for cls in sc.domain_outage_hours:
        if cls in rated and r.node_level(cls):
            out.append(Problem(f"domainOutageHours.{cls.value}",
                               "this class hits single nodes (domain `node`); set `domains` for it "
                               "or drop the key"))
    out += _isolation_keys(sc, r, monitor_only, report)
    out += _detection_keys(sc, r, report)
    lm = sc.lemons
    if lm.multiplier != 1.0 and lm.fraction == 0.0:
        out.append(Problem("lemons.multiplier", "lemons.fraction is 0: no node gets the multiplier"))
    if lm.fraction > 0.0 and lm.multiplier == 1.0:
        out.append(Problem("lemons.fraction", "lemons.multiplier is 1: the chosen nodes fail as the rest"))
    if "recurrence_cap" in lm.model_fields_set and lm.recurrence_factor == 1.0:
        out.append(Problem("lemons.recurrenceCap", "lemons.recurrenceFactor is 1: nothing to cap"))
    out += _spare_and_repair_keys(sc, r)
    if sc.storage.reference_gpus is not None and not rated & set(STORE):
        out.append(Problem("storage.referenceGpus", "no storage fault has a rate here"))
    if sc.storage.degraded_factor is not None and FaultClass.STORAGE_DEGRADED not in rated:
        out.append(Problem("storage.degradedFactor", "storage-degraded has no rate here"))
    if monitor_only:
        for key, camel in (("max_quarantined_share", "maxQuarantinedShare"),
                           ("window_minutes", "windowMinutes")):
            if key in sc.circuit_breaker.model_fields_set:
                out.append(Problem(f"circuitBreaker.{camel}", "remediation.mode is monitor-only: "
                                                              "the remediator quarantines nothing"))
    if sc.checkpoint.retries is not None and sc.checkpoint.failure_probability in (None, 0.0):
        out.append(Problem("checkpoint.retries", "no save fails on its own here "
                                                 "(checkpoint.failureProbability): nothing to retry"))
    if sc.upgrade is not None and sc.upgrade.start_hours * 3600.0 >= r.days * 86400.0:
        out.append(Problem("upgrade.startHours",
                           f"the upgrade would start at {sc.upgrade.start_hours:g} h, after the "
                           f"{r.days:g}-day horizon"))
    return out


def _isolation_keys(sc: Scenario, r: Resolved, monitor_only: bool, report: str) -> list[Problem]:
    out: list[Problem] = []
    isolating = {a for a in r.rungs() if a.isolates_node}
    for cls in sc.isolate_seconds:
        path = f"isolateSeconds.{cls.value}"
        if cls not in r.rated:
            continue  # (refused above: no rate)
        if cls in STORE:
            out.append(Problem(path, "a store fault isolates no node"))
        elif monitor_only:
            out.append(Problem(path, "remediation.mode is monitor-only: a human isolates every node "
                                     "(circuitBreaker.manualSeconds)"))
        elif r.handling[cls].domain == "cluster":
            out.append(Problem(path, "a cluster-wide fault isolates no node"))
        elif r.node_level(cls) and not any(
                a is not None and a.isolates_node for k in r.kinds if k.fault_class is cls
                for a in (k.action, k.escalate_to)):
            out.append(Problem(path, "no fault of this class is isolated (its actions and "
                                     "escalations leave the node in place)"))
        elif r.measured_all(cls, 1):
            out.append(Problem(path, f"{report} measured this class's isolation; it takes precedence"))
    if not r.isolates() and sc.circuit_breaker.manual_seconds is not None:
        out.append(Problem("circuitBreaker.manualSeconds", "no fault here isolates a node"))
    if sc.attempt_caps.window_hours is not None and not isolating & {
            LadderAction.RESET_GPU, LadderAction.REBOOT_NODE}:
        out.append(Problem("attemptCaps.windowHours",
                           "no fault here is reset or rebooted, the rungs the stack's attempt caps count"))
    return out


def _detection_keys(sc: Scenario, r: Resolved, report: str) -> list[Problem]:
    out: list[Problem] = []
    stack = r.stack
    for key, table in (("detection.mode", sc.detection.mode),
                       ("detection.activeSeconds", sc.detection.active_seconds)):
        for cls in table:
            path = f"{key}.{cls.value}"
            if cls not in r.rated:
                continue  # (refused above: no rate)
            if not r.detect_used(cls):
                out.append(Problem(path, "every fault of this class leaves the job running (action "
                                         "none): its detection time is never waited for"))
            elif r.measured_all(cls, 0):
                out.append(Problem(path, f"{report} measured this class's detection; it takes precedence"))
            elif key == "detection.activeSeconds" and detection_mode(stack, sc, cls) != "active":
                out.append(Problem(path, "this class is detected passively (stack remediation.detection "
                                         "/ scenario detection.mode); set its mode to active or drop "
                                         "the key"))
    waited = [c for c in r.rated if r.detect_used(c) and not r.measured_all(c, 0)]
    if sc.detection.collective_timeout_seconds is not None and all(
            detection_mode(stack, sc, c) == "active" for c in waited):
        out.append(Problem("detection.collectiveTimeoutSeconds",
                           "every class whose detection is waited for is detected actively (or measured "
                           "by the game-day): the timeout is never waited for"))
    return out


def _spare_and_repair_keys(sc: Scenario, r: Resolved) -> list[Problem]:
    out: list[Problem] = []
    if r.spares == 0:
        for key, camel in (("mode", "mode"), ("cold_start_seconds", "coldStartSeconds")):
            if key in sc.spares.model_fields_set:
                out.append(Problem(f"spares.{camel}", "there are no spares here (stack nodePools / "
                                                      "scenario spares.count)"))
    elif sc.spares.cold_start_seconds is not None and r.spare_mode is SpareMode.WARM:
        out.append(Problem("spares.coldStartSeconds", "spares are warm here (stack nodePools / "
                                                      "scenario spares.mode): no cold start"))
    rungs = r.rungs()
    for key, camel, rung in (("reset_gpu_seconds", "resetGpuSeconds", LadderAction.RESET_GPU),
                             ("reboot_node_seconds", "rebootNodeSeconds", LadderAction.REBOOT_NODE),
                             ("replace", "replace", LadderAction.REPLACE)):
        if key in sc.repair.model_fields_set and rung not in rungs:
            out.append(Problem(f"repair.{camel}",
                               f"no rated fault here reaches the `{rung.value}` rung (catalog action, "
                               "escalation, the stack's attempt caps)"))
    return out
