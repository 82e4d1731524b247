"""Self-healing: node-problem-detector running gpufleet's node-health checks as a custom plugin
monitor, and NVSentinel (detection, quarantine, drain, remediation) with the stack's circuit
breaker and remediation mode.

node-problem-detector custom plugins (its docs, "Custom Plugin Monitor"): exit 0 = OK, 1 = NonOK
(problem), 2 = Unknown; a `permanent` rule sets a node condition. The check itself is a generated
POSIX shell script (gpufleet.infra.npd_check, ADR 0020) shipped in NPD's custom-config ConfigMap,
because the NPD image has no Python. NVSentinel values (its configuration docs):
`global.dryRun`, `global.faultQuarantine/nodeDrainer/faultRemediation.enabled`,
`fault-quarantine.circuitBreaker.{enabled, percentage, duration}` where percentage is the share of
nodes that may be quarantined within the sliding window before the breaker trips, and
`fault-quarantine.ruleSets` (CEL rules, docs/configuration/fault-quarantine.md "Rule Sets") into
which the stack's XID policy is rendered. NVSentinel is NVIDIA-only: installed only when the stack
has NVIDIA GPUs.
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
from gpufleet.core.node_health import CONDITION, HEALTHY_MESSAGE, HEALTHY_REASON, PROBLEM_REASON
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


def remediation_policy(rem: RemediationSpec, table: Mapping[int, XidRule]) -> dict[str, Any]:
    """The stack's whole remediation policy as one document (mode, breaker, attempt caps, the
    resolved XID table with each entry's source), published next to NVSentinel."""
    return {
        "mode": rem.mode,
        "circuitBreaker": rem.circuit_breaker.model_dump(mode="json", by_alias=True),
        "attemptCaps": rem.attempt_caps.model_dump(mode="json", by_alias=True),
        "xids": {
            str(x): {"action": r.action.value, "faultClass": r.fault_class.value, "source": r.source}
            for x, r in sorted(table.items())
        },
    }


def nvsentinel_values(
    rem: RemediationSpec, tolerations: list[dict[str, str]], table: Mapping[int, XidRule] | None = None
) -> dict[str, Any]:
    """Remediation mode -> which NVSentinel modules act: monitor-only runs everything dry."""
    drain = rem.mode == "cordon-drain-remediate"
    breaker = rem.circuit_breaker
    return {
        "global": {
            "dryRun": rem.mode == "monitor-only",
            "faultQuarantine": {"enabled": True},
            "nodeDrainer": {"enabled": drain},
            "faultRemediation": {"enabled": drain},
            "tolerations": tolerations,
        },
        "fault-quarantine": {
            "circuitBreaker": {
                "enabled": True,
                # A whole percent, rounded up so a small share never becomes 0 (which would block all).
                "percentage": max(1, math.ceil(breaker.max_quarantined_share * 100)),
                "duration": f"{round(breaker.window_minutes * 60)}s",
            },
            "ruleSets": xid_rule_sets(table or {}),
        },
    }


class SelfHealing(pulumi.ComponentResource):
    def __init__(self, name: str, args: SelfHealingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:healing:SelfHealing", name, None, opts)
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
