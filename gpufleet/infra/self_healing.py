"""Self-healing: node-problem-detector running gpufleet's node-health checks as a custom plugin
monitor, and NVSentinel (detection, quarantine, drain, remediation) configured from the stack's
whole remediation policy. NVSentinel is NVIDIA-only: installed only when the stack has NVIDIA GPUs.

node-problem-detector custom plugins (its docs, "Custom Plugin Monitor"): exit 0 = OK, 1 = NonOK
(problem), 2 = Unknown; a `permanent` rule sets a node condition. The check itself is a generated
POSIX shell script (gpufleet.infra.npd_check, ADR 0020) shipped in NPD's custom-config ConfigMap,
because the NPD image has no Python.

Every field of the stack's `remediation:` and the NVSentinel Helm values it becomes (NVIDIA/NVSentinel
docs/configuration/*.md and data-models/protobufs/health_event.proto, read at the repository head:
no snapshot at the pinned chart v0.6.0 was reachable here; ADR 0038):

- `mode` -> `global.dryRun` (monitor-only), `global.faultQuarantine.enabled`,
  `global.nodeDrainer.enabled` and `global.faultRemediation.enabled` (cordon-drain-remediate) —
  docs/configuration/README.md "Dry Run Mode", fault-remediation.md "Module Enable/Disable".
- `circuitBreaker` -> `fault-quarantine.circuitBreaker.{enabled, percentage, duration}` (the share
  of nodes that may be quarantined within the sliding window) — fault-quarantine.md.
- `detection` (class -> active|passive) -> the monitors that detect each `active` class without
  waiting for the job to notice, switched on: `global.gpuHealthMonitor.enabled` (DCGM health
  watches), `global.syslogHealthMonitor.enabled` (XIDs from the journal),
  `global.nicHealthMonitor.enabled` (InfiniBand/RoCE link state and error counters) —
  gpu-health-monitor.md, syslog-health-monitor.md, nic-health-monitor.md. Node crash and hang are
  found by Kubernetes itself (the node lifecycle controller on the kubelet's Lease); a class no
  deployed detector finds actively is refused (`detection_problems`).
- `xidOverrides.<xid>` -> (1) `fault-quarantine.ruleSets`: the XID is in the cordon rule exactly
  when its resolved action isolates the node (fault-quarantine.md "Rule Sets", CEL over the
  HealthEvent); (2) an OverrideTransformer rule in the platform connector that rewrites the
  syslog monitor's HealthEvent for that XID: `isFatal` = the action isolates the node,
  `recommendedAction` = the action in NVSentinel's vocabulary (RECOMMENDED_ACTION), the rule's name
  carries the override's reason — platform-connectors.md "Override Transformer Configuration"
  (`platformConnector.pipeline`, `platformConnector.transformers.OverrideTransformer.rules`). The
  override's `faultClass` is what makes the action isolating or not (xid_policy refuses a class and
  an action that disagree), so it arrives as `isFatal` and as the cordon rule.
- `attemptCaps` -> nothing: NVSentinel has no per-rung attempt cap (its escalation after repeated
  faults is health-events-analyzer's built-in rules with fixed thresholds, replaced only as a whole
  TOML document: health-events-analyzer.md), and nothing else the platform deploys counts attempts.
  A stack that sets them is refused by `gpufleet validate` (`remediation_problems`) and warned of
  by the program; only the simulator models them.

Detection problems and overrides left out for a conflict also stop the Pulumi program. On stacks
without NVIDIA GPUs no remediator is deployed (NPD only sets the node condition): the program says
so with a warning in `pulumi preview`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.catalog import XidRule, isolating_xids
from gpufleet.config.model import RemediationSpec, SloSpec
from gpufleet.core.breaker import breaker_percentage
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.node_health import CONDITION, HEALTHY_MESSAGE, HEALTHY_REASON, PROBLEM_REASON
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.infra.charts import CHARTS, chart_namespace, helm_release
from gpufleet.infra.common import MANAGED_BY, child
from gpufleet.infra.npd_check import MAX_OUTPUT, SCRIPT_NAME, render_script

CUSTOM_CONFIG_DIR = "/custom-config"  # where the NPD chart mounts settings.custom_monitor_definitions
PLUGIN_FILE = "gpufleet-health.json"
POLICY_CONFIG_MAP = "gpufleet-remediation-policy"


@dataclass(frozen=True)
class SelfHealingArgs:
    remediation: RemediationSpec
    slos: SloSpec
    tolerations: list[dict[str, str]]
    xid_table: Mapping[int, XidRule]  # the catalog's XID policy with the stack's overrides applied
    nvidia: bool = True  # NVSentinel watches NVIDIA GPUs only
    depends_on: tuple[pulumi.Resource, ...] = ()  # cert-manager: NVSentinel's certificates


def health_check_interval_seconds(slos: SloSpec) -> int:
    """How often NPD runs the checks: a quarter of the tightest detection budget, so a fault is
    seen within budget even when a run just missed it, clamped to 10..60 s (the checks read DCGM
    and the kernel log; more often than 10 s costs CPU on every node for no gain)."""
    budgets = [b.detect_seconds for b in slos.budgets.values()]
    tightest = min(budgets) if budgets else 240.0
    return max(10, min(60, math.floor(tightest / 4)))


def npd_plugin_config(slos: SloSpec) -> dict[str, Any]:
    interval = health_check_interval_seconds(slos)
    timeout = f"{max(5, interval - 5)}s"
    return {
        "plugin": "custom",
        "pluginConfig": {
            "invoke_interval": f"{interval}s",
            "timeout": timeout,
            "max_output_length": MAX_OUTPUT,
            "concurrency": 1,
        },
        "source": "gpufleet-node-health",
        "metricsReporting": True,
        "conditions": [
            {"type": CONDITION, "reason": HEALTHY_REASON, "message": HEALTHY_MESSAGE}
        ],
        "rules": [
            {
                "type": "permanent",
                "condition": CONDITION,
                "reason": PROBLEM_REASON,
                # A ConfigMap file has no exec bit: the shell runs it (dash in the NPD image).
                "path": "/bin/sh",
                "args": [f"{CUSTOM_CONFIG_DIR}/{SCRIPT_NAME}"],
                "timeout": timeout,
            }
        ],
    }


def npd_values(args: SelfHealingArgs) -> dict[str, Any]:
    return {
        "settings": {
            "custom_monitor_definitions": {
                PLUGIN_FILE: json.dumps(npd_plugin_config(args.slos), sort_keys=True),
                SCRIPT_NAME: render_script(args.xid_table),
            },
            "custom_plugin_monitors": [f"{CUSTOM_CONFIG_DIR}/{PLUGIN_FILE}"],
        },
        "tolerations": args.tolerations,
    }


def xid_rule_sets(table: Mapping[int, XidRule]) -> list[dict[str, Any]]:
    """fault-quarantine rule sets: cordon on fatal GPU health-monitor events, and on kernel-log XIDs
    exactly when the stack's resolved policy isolates the node for them (an override to a milder
    action removes the XID from the list; one to reset/reboot/replace adds it)."""
    codes = ", ".join(f"'{x}'" for x in isolating_xids(table))
    return [
        {
            "version": "1",
            "name": "gpufleet-gpu-fatal",
            "match": {
                "all": [
                    {
                        "kind": "HealthEvent",
                        "expression": "event.agent == 'gpu-health-monitor' && "
                        "event.componentClass == 'GPU' && event.isFatal == true",
                    }
                ]
            },
            "cordon": {"shouldCordon": True},
        },
        {
            "version": "1",
            "name": "gpufleet-isolating-xids",
            "match": {
                "all": [
                    {
                        "kind": "HealthEvent",
                        "expression": "event.agent == 'syslog-health-monitor' && "
                        "event.componentClass == 'GPU' && event.errorCode != null && "
                        f"event.errorCode.exists(e, e in [{codes}])",
                    }
                ]
            },
            "cordon": {"shouldCordon": True},
        },
    ]


# The ladder's rungs as NVSentinel's RecommendedAction (data-models/protobufs/health_event.proto):
# restarting the job is the application's restart; a node reboot and a replacement are the
# bare-metal ones (gpufleet's NVIDIA stacks are GPU servers; the VM actions RESTART_VM/REPLACE_VM
# are not emitted); a replacement is an RMA, which NVSentinel hands to people as CONTACT_SUPPORT.
RECOMMENDED_ACTION: dict[LadderAction, str] = {
    LadderAction.NONE: "NONE",
    LadderAction.RESTART_JOB: "RESTART_APP",
    LadderAction.RESET_GPU: "COMPONENT_RESET",
    LadderAction.REBOOT_NODE: "RESTART_BM",
    LadderAction.REPLACE: "CONTACT_SUPPORT",
}

# NVSentinel's health monitors by what they find without waiting for the job to notice
# (gpu-health-monitor.md: DCGM health watches; syslog-health-monitor.md: XID/SXID in the journal;
# nic-health-monitor.md: InfiniBand/RoCE port state and error counters incl. link_error_recovery).
NVSENTINEL_MONITORS: dict[FaultClass, tuple[str, ...]] = {
    FaultClass.GPU_FATAL: ("gpuHealthMonitor", "syslogHealthMonitor"),
    FaultClass.GPU_CONTAINED: ("syslogHealthMonitor",),
    FaultClass.GPU_DEGRADED: ("gpuHealthMonitor",),
    FaultClass.FABRIC_LINK_DOWN: ("nicHealthMonitor",),
    FaultClass.FABRIC_FLAP: ("nicHealthMonitor",),
    FaultClass.FABRIC_DEGRADED: ("nicHealthMonitor",),
}
# Found actively on every stack: a lost or hung node stops renewing its kubelet Lease and the node
# lifecycle controller marks it NotReady; an InfiniBand/RoCE port that is not ACTIVE is a problem
# for gpufleet's own NPD check (npd_check), which runs on every stack.
ACTIVE_EVERYWHERE = frozenset({FaultClass.NODE_CRASH, FaultClass.NODE_HANG, FaultClass.FABRIC_LINK_DOWN})


NO_ATTEMPT_CAPS = (
    "nothing the platform deploys enforces per-rung attempt caps: NVSentinel has no such setting (its "
    "escalation after repeated faults is health-events-analyzer's built-in rules, e.g. 5 remediations "
    "of one node within 7 days -> CONTACT_SUPPORT)"
)


def detection_problems(rem: RemediationSpec, nvidia: bool) -> list[Problem]:
    """`detection.<class>: active` for a class that no detector the stack deploys finds actively."""
    out = []
    for cls, how in sorted(rem.detection.items()):
        if how != "active" or cls in ACTIVE_EVERYWHERE or (nvidia and cls in NVSENTINEL_MONITORS):
            continue
        where = "NVSentinel's monitors (NVIDIA stacks only)" if cls in NVSENTINEL_MONITORS else "none"
        out.append(
            Problem(
                f"remediation.detection.{cls.value}",
                f"no detector this stack deploys finds {cls.value} actively (node-problem-detector's "
                f"check: XIDs and fabric ports; Kubernetes: lost nodes; {where} for this class); "
                "say passive, or deploy a detector for it",
            )
        )
    return out


def remediation_problems(rem: RemediationSpec, nvidia: bool) -> list[Problem]:
    """What of the stack's remediation policy the platform it deploys cannot carry out, with its
    path: `gpufleet validate` refuses it (the program refuses the detection problems and warns of
    attempt caps), never dropped."""
    out = []
    if "attempt_caps" in rem.model_fields_set:
        out.append(
            Problem(
                "remediation.attemptCaps",
                f"{NO_ATTEMPT_CAPS}; remove the key (the simulator keeps its default caps)",
            )
        )
    return out + detection_problems(rem, nvidia)


def unapplied_overrides(rem: RemediationSpec, table: Mapping[int, XidRule]) -> list[Problem]:
    """Overrides missing from the resolved XID table: xid_policy left them out for a conflict."""
    return [
        Problem(
            f"remediation.xidOverrides.{xid}",
            "not applied: it conflicts with the catalog (`gpufleet validate` says how)",
        )
        for xid in sorted(rem.xid_overrides)
        if xid not in table or not table[xid].source.startswith("stack override")
    ]


def xid_override_rules(table: Mapping[int, XidRule]) -> list[dict[str, Any]]:
    """The platform connector's OverrideTransformer rules: one per XID the stack overrides, matching
    the syslog monitor's HealthEvent for it (errorCode holds the XID as a string) and setting what
    the stack decided; first match wins, and no two rules match the same XID."""
    return [
        {
            "name": f"gpufleet-xid-{xid}: {rule.source.removeprefix('stack override: ')}",
            "when": f'event.agent == "syslog-health-monitor" && "{xid}" in event.errorCode',
            "override": {
                "isFatal": rule.action.isolates_node,
                "recommendedAction": RECOMMENDED_ACTION[rule.action],
            },
        }
        for xid, rule in sorted(table.items())
        if rule.source.startswith("stack override")
    ]


def remediation_policy(rem: RemediationSpec, table: Mapping[int, XidRule]) -> dict[str, Any]:
    """The stack's remediation policy as one document (mode, breaker, detection, the resolved XID
    table with each entry's source and NVSentinel action), published next to NVSentinel."""
    return {
        "mode": rem.mode,
        "circuitBreaker": rem.circuit_breaker.model_dump(mode="json", by_alias=True),
        "detection": {c.value: how for c, how in sorted(rem.detection.items())},
        "xids": {
            str(x): {
                "action": r.action.value,
                "faultClass": r.fault_class.value,
                "source": r.source,
                "nvsentinelAction": RECOMMENDED_ACTION[r.action],
            }
            for x, r in sorted(table.items())
        },
    }


def nvsentinel_values(
    rem: RemediationSpec, tolerations: list[dict[str, str]], table: Mapping[int, XidRule] | None = None
) -> dict[str, Any]:
    """The stack's remediation policy as NVSentinel's Helm values (the mapping: module docstring)."""
    table = table or {}
    drain = rem.mode == "cordon-drain-remediate"
    breaker = rem.circuit_breaker
    global_values: dict[str, Any] = {
        "dryRun": rem.mode == "monitor-only",
        "faultQuarantine": {"enabled": True},
        "nodeDrainer": {"enabled": drain},
        "faultRemediation": {"enabled": drain},
        "tolerations": tolerations,
    }
    for cls, how in sorted(rem.detection.items()):
        if how == "active":
            for monitor in NVSENTINEL_MONITORS.get(cls, ()):
                global_values[monitor] = {"enabled": True}
    values: dict[str, Any] = {
        "global": global_values,
        "fault-quarantine": {
            "circuitBreaker": {
                "enabled": True,
                # A whole percent, rounded up so a small share never becomes 0 (which would block all).
                "percentage": breaker_percentage(breaker.max_quarantined_share),
                "duration": f"{round(breaker.window_minutes * 60)}s",
            },
            "ruleSets": xid_rule_sets(table),
        },
    }
    rules = xid_override_rules(table)
    if rules:
        # `pipeline` is a list, so Helm replaces it whole: both documented stages, the metadata
        # augmentor as documented (off) and the override transformer on.
        values["platformConnector"] = {
            "pipeline": [
                {"name": "MetadataAugmentor", "enabled": False, "config": "/etc/config/metadata.toml"},
                {"name": "OverrideTransformer", "enabled": True, "config": "/etc/config/overrides.toml"},
            ],
            "transformers": {"OverrideTransformer": {"rules": rules}},
        }
    return values


class SelfHealing(pulumi.ComponentResource):
    def __init__(self, name: str, args: SelfHealingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:healing:SelfHealing", name, None, opts)
        rem = args.remediation
        problems = detection_problems(rem, args.nvidia) + unapplied_overrides(rem, args.xid_table)
        if problems:
            # The lines `gpufleet validate` prints, for the same stack file.
            raise pulumi.RunError(InputError(f"stacks/Pulumi.{pulumi.get_stack()}.yaml", problems).render())
        if "attempt_caps" in rem.model_fields_set:
            # `gpufleet validate` refuses the key; here a stack rebuilt from a dump (tests, the
            # game-day's copy) carries it at its defaults, so the program only says it is not enforced.
            pulumi.log.warn(f"remediation.attemptCaps: {NO_ATTEMPT_CAPS}", self)
        if not args.nvidia:
            pulumi.log.warn(
                "remediation: no NVIDIA GPUs, so no NVSentinel: node-problem-detector sets the "
                f"{CONDITION} condition and nothing acts on it (mode, circuitBreaker and "
                "xidOverrides are not enforced on this stack)",
                self,
            )
        self.npd = helm_release(
            f"{name}-node-problem-detector", "node-problem-detector", npd_values(args), self
        )
        self.nvsentinel: k8s.helm.v3.Release | None = None
        if args.nvidia:
            ns = chart_namespace(f"{name}-nvsentinel", "nvsentinel", self)
            k8s.core.v1.ConfigMap(
                f"{name}-remediation-policy",
                metadata={
                    "name": POLICY_CONFIG_MAP,
                    "namespace": CHARTS["nvsentinel"].namespace,
                    "labels": MANAGED_BY,
                },
                data={
                    "policy.json": json.dumps(
                        remediation_policy(args.remediation, args.xid_table), sort_keys=True
                    )
                },
                opts=child(self, [ns] if ns is not None else []),
            )
            self.nvsentinel = helm_release(
                f"{name}-nvsentinel",
                "nvsentinel",
                nvsentinel_values(args.remediation, args.tolerations, args.xid_table),
                self,
                namespace=ns,
                depends_on=list(args.depends_on),
            )
        self.register_outputs(
            {"mode": args.remediation.mode, "checkIntervalSeconds": health_check_interval_seconds(args.slos)}
        )
