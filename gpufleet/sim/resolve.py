"""Resolve a simulation's inputs: stack + fault catalog + scenario + game-day report -> SimParams.

Precedence, highest first: a game-day report's measured times, the scenario file, the stack,
the catalog (rates), `gpufleet.sim.defaults` (sourced figures and stated assumptions). Every
number's origin is written into `SimParams.sources`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.catalog import Catalog, XidRule, xid_policy
from gpufleet.config.model import NodePool, SpareMode, StackSpec
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sim import defaults as d
from gpufleet.sim.gameday_input import Measured
from gpufleet.sim.params import ClassHandling, FaultKind, SimParams, UpgradeWave
from gpufleet.sim.scenario import Scenario
from gpufleet.sim.scenario_checks import Resolved, detection_mode, unused_keys


def catalog_kinds(
    catalog: Catalog, gpus_per_node: int, xid_rules: Mapping[int, XidRule] | None = None
) -> list[FaultKind]:
    """One fault stream per catalog entry with a published rate; an XID fault takes its class and
    action from the stack's XID policy (`xid_rules`: the catalog with remediation.xidOverrides)."""
    out = []
    for f in catalog:
        if f.rate is None:
            continue
        esc = f.escalation
        rule = xid_rules.get(f.xid) if xid_rules is not None and f.xid is not None else None
        out.append(FaultKind(
            fault_id=f.id,
            fault_class=rule.fault_class if rule else f.fault_class,
            cause=f.rate.cause,
            source=f.rate.source,
            per_node_hour=f.rate.per_gpu_hour(gpus_per_node) * gpus_per_node,
            action=rule.action if rule else f.action,
            escalate_repeats=esc.repeats if esc else None,
            escalate_window_hours=esc.window_hours if esc else None,
            escalate_to=esc.to if esc else None,
        ))
    return out


def apply_rate_overrides(kinds: list[FaultKind], sc: Scenario, gpus_per_node: int) -> list[FaultKind]:
    """Scale every rate by `rateScale`; replace a class's total where the scenario gives one."""
    out = []
    for k in kinds:
        ov = sc.rates.get(k.fault_class)
        rate = k.per_node_hour * sc.rate_scale
        src = k.source if sc.rate_scale == 1.0 else f"{k.source}; x{sc.rate_scale} (scenario rateScale)"
        action = k.action
        if ov is not None and ov.has_rate:
            total = sum(x.per_node_hour for x in kinds if x.fault_class is k.fault_class)
            new_total = ov.per_gpu_hour(gpus_per_node) * gpus_per_node * sc.rate_scale
            rate = k.per_node_hour / total * new_total if total > 0 else 0.0
            src = f"{ov.source} (scenario rates.{k.fault_class.value}; split as in the catalog)"
        if ov is not None and ov.action is not None:
            action = ov.action
        out.append(FaultKind(k.fault_id, k.fault_class, k.cause, src, rate, action,
                             k.escalate_repeats, k.escalate_window_hours, k.escalate_to))
    present = {k.fault_class for k in kinds if k.per_node_hour > 0}
    for cls, ov in sc.rates.items():
        if cls in present or not ov.has_rate:
            continue  # (an action alone for a class without a rate is refused by `unused_keys`)
        action = ov.action or LadderAction(d.CLASS_DEFAULT_ACTION[cls])
        out.append(FaultKind(
            fault_id=f"scenario-{cls.value}", fault_class=cls, cause=f"{cls.value} (scenario)",
            source=ov.source,
            per_node_hour=ov.per_gpu_hour(gpus_per_node) * gpus_per_node * sc.rate_scale,
            action=action,
        ))
    return out


def pick_pool(stack: StackSpec, name: str | None, file: str) -> NodePool:
    if name is None:
        return max(stack.node_pools, key=lambda p: p.nodes * p.gpus_per_node)
    for p in stack.node_pools:
        if p.name == name:
            return p
    known = ", ".join(p.name for p in stack.node_pools)
    raise InputError(file, [Problem("pool", f"no node pool {name!r} in the stack; pools: {known}")])


def restart_seconds(job_gpus: int, load_seconds: float, sc: Scenario) -> tuple[float, str]:
    """Restart cost at this job size: checkpoint load + re-initialisation growing with size."""
    ref_g = sc.restart.reference_gpus if sc.restart.reference_gpus is not None else d.RESTART_REF_GPUS
    ref_s = (sc.restart.reference_seconds if sc.restart.reference_seconds is not None
             else d.RESTART_REF_SECONDS.value)
    b = sc.restart.exponent if sc.restart.exponent is not None else d.RESTART_EXPONENT.value
    init = ref_s * (job_gpus / ref_g) ** b
    src = (f"checkpoint load {load_seconds:g} s + {ref_s:g} s x ({job_gpus}/{ref_g} GPUs)^{b:g} "
           f"= {init:.0f} s re-initialisation ({d.RESTART_REF_SECONDS.source}; {d.RESTART_EXPONENT.source})")
    return load_seconds + init, src


def _manual_seconds(sc: Scenario) -> float:
    ms = sc.circuit_breaker.manual_seconds
    return ms if ms is not None else d.MANUAL_SECONDS.value


def _triples(m: Measured, det: float, iso: float, floor: float, manual: float | None
             ) -> tuple[tuple[float, float, float], ...]:
    """One (detect, isolate, restart floor) per game-day experiment, in seconds; an unmeasured part
    takes the class's resolved value."""
    out = []
    for md, mi, mr in m.samples:
        dd = md if md is not None else det
        ii = (mi - (md if md is not None else 0.0)) if mi is not None else iso
        ii = manual if manual is not None else max(ii, 0.0)
        ff = mr - max(v for v in (mi, md, 0.0) if v is not None) if mr is not None else floor
        out.append((dd, ii, ff))
    return tuple(out)


def _handling(
    stack: StackSpec, sc: Scenario, measured: Mapping[FaultClass, Measured], report_file: str
) -> dict[FaultClass, ClassHandling]:
    timeout = (sc.detection.collective_timeout_seconds
               if sc.detection.collective_timeout_seconds is not None else d.COLLECTIVE_TIMEOUT.value)
    manual_isolation = stack.remediation.mode == "monitor-only"
    out = {}
    for cls in FaultClass:
        mode = detection_mode(stack, sc, cls)
        if mode == "active":
            if cls in sc.detection.active_seconds:
                det, det_src = sc.detection.active_seconds[cls], "scenario detection.activeSeconds"
            else:
                det, det_src = d.ACTIVE_DETECT_SECONDS[cls].value, d.ACTIVE_DETECT_SECONDS[cls].source
        else:
            det, det_src = timeout, f"passive: collective timeout ({d.COLLECTIVE_TIMEOUT.source})"
        if cls in sc.isolate_seconds:
            iso, iso_src = sc.isolate_seconds[cls], "scenario isolateSeconds"
        else:
            iso, iso_src = d.ISOLATE_SECONDS.value, d.ISOLATE_SECONDS.source
        if manual_isolation:
            iso, iso_src = _manual_seconds(sc), "remediation.mode monitor-only: a human isolates"
        floor, floor_src = 0.0, "none"
        triples: tuple[tuple[float, float, float], ...] = ()
        m = measured.get(cls)
        if m is not None:
            tag = f"game-day report {report_file} (median of {len(m.experiments)})"
            if m.recovered_first:
                tag += (f"; recovered before detection or isolation, which count up to the recovery: "
                        f"{', '.join(m.recovered_first)}")
            if m.detect_seconds is not None:
                det, det_src = m.detect_seconds, tag
            if m.isolate_seconds is not None and not manual_isolation:  # monitor-only: a human
                iso, iso_src = m.isolate_seconds - (m.detect_seconds or 0.0), tag
            if m.recover_seconds is not None:
                before = max(v for v in (m.isolate_seconds, m.detect_seconds, 0.0) if v is not None)
                floor = max(0.0, m.recover_seconds - before)  # (medians of separate experiments)
                floor_src = f"{tag}: measured restart, a lower bound"
            if len(m.samples) > 1:  # draw each fault's times from the experiments, not the median
                triples = _triples(m, det, iso, floor, _manual_seconds(sc) if manual_isolation else None)
                det_src = iso_src = f"{tag}; each fault draws one experiment's times"
        outage = sc.domain_outage_hours.get(
            cls, d.DOMAIN_OUTAGE_HOURS.get(cls, d.DOMAIN_OUTAGE_FALLBACK).value)
        out[cls] = ClassHandling(
            detect_seconds=det, detect_source=det_src, isolate_seconds=iso, isolate_source=iso_src,
            restart_floor_seconds=floor, restart_floor_source=floor_src,
            weibull_shape=sc.weibull_shape.get(cls, 1.0),
            domain=sc.domains.get(cls) or d.DEFAULT_DOMAINS.get(cls, "node"),  # type: ignore[arg-type]
            domain_outage_hours=outage,
            measured=triples,
        )
    return out


def resolve(
    stack: StackSpec,
    catalog: Catalog,
    scenario: Scenario | None = None,
    *,
    scenario_file: str = "(scenario)",
    measured: Mapping[FaultClass, Measured] | None = None,
    report_file: str = "",
    days: float | None = None,
    pool: str | None = None,
    spares: int | None = None,
) -> SimParams:
    """All inputs of a simulation, resolved. Command-line values (days, pool, spares) win."""
    sc = scenario or Scenario()
    np_ = pick_pool(stack, pool if pool is not None else sc.pool, scenario_file)
    ck = stack.storage.checkpoint
    interval = (sc.checkpoint.interval_minutes if sc.checkpoint.interval_minutes is not None
                else ck.interval_minutes) * 60.0
    write = sc.checkpoint.write_seconds if sc.checkpoint.write_seconds is not None else ck.write_seconds
    load = sc.checkpoint.load_seconds if sc.checkpoint.load_seconds is not None else ck.load_seconds
    job_gpus = np_.nodes * np_.gpus_per_node
    restart, restart_src = restart_seconds(job_gpus, load, sc)
    rules, conflicts = xid_policy(catalog, stack.remediation.xid_overrides)
    if conflicts:
        raise InputError("stack remediation", conflicts)
    kinds = apply_rate_overrides(catalog_kinds(catalog, np_.gpus_per_node, rules), sc, np_.gpus_per_node)
    if spares is not None:
        n_spares = spares
    else:
        n_spares = sc.spares.count if sc.spares.count is not None else np_.spares
    mode = sc.spares.mode or np_.spare_mode
    br = stack.remediation.circuit_breaker
    rp = sc.repair
    bins = (tuple((b.share, b.min_hours, b.max_hours) for b in rp.replace) if rp.replace is not None
            else d.REPAIR_BINS)
    horizon = days if days is not None else (sc.days if sc.days is not None else 54.0)
    handling = _handling(stack, sc, measured or {}, report_file)
    problems = unused_keys(sc, Resolved(stack, kinds, handling, measured or {}, n_spares, mode, horizon,
                                        report_file))
    if problems:
        raise InputError(scenario_file, problems)
    up = sc.upgrade
    upgrade = (UpgradeWave(up.start_hours * 3600.0, up.wave_nodes, up.wave_minutes * 60.0)
               if up is not None else None)
    st = sc.storage
    ck_fail = sc.checkpoint.failure_probability
    overridden = {k: f"scenario {k} {v!r} overridden by the command line"
                  for k, v, cli in (("pool", sc.pool, pool), ("days", sc.days, days))
                  if v is not None and cli is not None}
    return SimParams(
        pool=np_.name,
        accelerator=np_.accelerator.value,
        job_nodes=np_.nodes,
        gpus_per_node=np_.gpus_per_node,
        spares=n_spares,
        spare_mode="warm" if mode is SpareMode.WARM else "cold",
        nodes_per_rack=np_.topology.nodes_per_rack,
        nodes_per_leaf=np_.topology.nodes_per_leaf,
        days=horizon,
        kinds=tuple(kinds),
        handling=handling,
        lemon_fraction=sc.lemons.fraction,
        lemon_multiplier=sc.lemons.multiplier,
        recurrence_factor=sc.lemons.recurrence_factor,
        recurrence_cap=sc.lemons.recurrence_cap,
        checkpoint_interval_seconds=interval,
        checkpoint_write_seconds=write,
        checkpoint_load_seconds=load,
        restart_seconds=restart,
        restart_source=restart_src,
        cold_start_seconds=(sc.spares.cold_start_seconds if sc.spares.cold_start_seconds is not None
                            else d.COLD_START_SECONDS.value),
        reset_gpu_seconds=(rp.reset_gpu_seconds if rp.reset_gpu_seconds is not None
                           else d.RESET_GPU_SECONDS.value),
        reboot_node_seconds=(rp.reboot_node_seconds if rp.reboot_node_seconds is not None
                             else d.REBOOT_NODE_SECONDS.value),
        repair_bins=bins,
        breaker_max_share=(sc.circuit_breaker.max_quarantined_share
                           if sc.circuit_breaker.max_quarantined_share is not None
                           else br.max_quarantined_share),
        breaker_window_seconds=60.0 * (sc.circuit_breaker.window_minutes
                                       if sc.circuit_breaker.window_minutes is not None
                                       else br.window_minutes),
        manual_seconds=_manual_seconds(sc),
        manual_remediation=stack.remediation.mode == "cordon",
        cap_reset_gpu=stack.remediation.attempt_caps.reset_gpu,
        cap_reboot_node=stack.remediation.attempt_caps.reboot_node,
        attempt_window_seconds=(sc.attempt_caps.window_hours * 3600.0
                                if sc.attempt_caps.window_hours is not None else None),
        checkpoint_failure_probability=(ck_fail if ck_fail is not None
                                        else d.CHECKPOINT_FAILURE_PROBABILITY.value),
        checkpoint_retries=sc.checkpoint.retries or 0,
        store_reference_gpus=(st.reference_gpus if st.reference_gpus is not None
                              else int(d.STORE_REFERENCE_GPUS.value)),
        store_degraded_factor=(st.degraded_factor if st.degraded_factor is not None
                               else d.STORE_DEGRADED_FACTOR.value),
        upgrade=upgrade,
        collective_timeout_seconds=(sc.detection.collective_timeout_seconds
                                    if sc.detection.collective_timeout_seconds is not None
                                    else d.COLLECTIVE_TIMEOUT.value),
        sources={
            **overridden,
            "store": (f"reference {d.STORE_REFERENCE_GPUS.source}; degraded factor "
                      f"{d.STORE_DEGRADED_FACTOR.source}" if not st.model_fields_set else "scenario storage"),
            "checkpoint_failures": (d.CHECKPOINT_FAILURE_PROBABILITY.source if ck_fail is None
                                    else "scenario checkpoint.failureProbability")
            + (f"; each retried at once up to {sc.checkpoint.retries} times (scenario checkpoint.retries; "
               "every save is charged the retries' mean write cost)" if sc.checkpoint.retries else ""),
            "attempt_caps": "stack remediation.attemptCaps"
            + (" within scenario attemptCaps.windowHours" if sc.attempt_caps.window_hours is not None
               else ", counted since the node was new"),
            "rates": "fault catalog (gpufleet/catalog/data, rate.source per kind)",
            "checkpoint": "stack storage.checkpoint"
            + (" + scenario" if sc.checkpoint.model_fields_set else ""),
            "restart": restart_src,
            "repair": d.REPAIR_SOURCE if rp.replace is None else "scenario repair.replace",
            "reset_gpu": d.RESET_GPU_SECONDS.source,
            "reboot_node": d.REBOOT_NODE_SECONDS.source,
            "cold_start": d.COLD_START_SECONDS.source,
            "manual": d.MANUAL_SECONDS.source,
            "remediation": f"stack remediation.mode {stack.remediation.mode}: " + {
                "monitor-only": "a human isolates every node (manual seconds) and repairs it",
                "cordon": "isolation automatic, then a human resets, reboots or replaces the node "
                          "(manual seconds before the rung's repair time)",
                "cordon-drain-remediate": "isolation and the ladder's rungs automatic",
            }[stack.remediation.mode],
            "domain_outage": "; ".join(f"{c.value}: {v.value:g} h {v.source}"
                                       for c, v in d.DOMAIN_OUTAGE_HOURS.items()),
            "breaker": "stack remediation.circuitBreaker",
            "spares": "stack nodePools" if spares is None and sc.spares.count is None else "override",
        },
    )

