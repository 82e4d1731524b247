"""Self-healing: node-problem-detector running gpufleet's node-health checks as a custom plugin
monitor, and NVSentinel (detection, quarantine, drain, remediation) with the stack's circuit
breaker and remediation mode.

node-problem-detector custom plugins (its docs, "Custom Plugin Monitor"): exit 0 = OK, 1 = NonOK
(problem), 2 = Unknown; a `permanent` rule sets a node condition. NVSentinel values (its
configuration docs): `global.dryRun`, `global.faultQuarantine/nodeDrainer/faultRemediation.enabled`,
`fault-quarantine.circuitBreaker.{enabled, percentage, duration}` where percentage is the share of
nodes that may be quarantined within the sliding window before the breaker trips.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pulumi

from gpufleet.config.model import RemediationSpec, SloSpec
from gpufleet.infra.charts import helm_release

GPUFLEET_HOST_DIR = "/opt/gpufleet/bin"  # where the node image installs the `gpufleet` binary
PLUGIN_FILE = "gpufleet-health.json"
CONDITION = "GpuFleetProblem"


@dataclass(frozen=True)
class SelfHealingArgs:
    remediation: RemediationSpec
    slos: SloSpec
    tolerations: list[dict[str, str]]


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
            "max_output_length": 200,
            "concurrency": 1,
        },
        "source": "gpufleet-node-health",
        "metricsReporting": True,
        "conditions": [
            {"type": CONDITION, "reason": "GpuFleetHealthy", "message": "gpufleet node-health checks pass"}
        ],
        "rules": [
            {
                "type": "permanent",
                "condition": CONDITION,
                "reason": "GpuFleetCheckFailed",
                "path": f"{GPUFLEET_HOST_DIR}/gpufleet",
                "args": ["node-health", "--format", "npd"],
                "timeout": timeout,
            }
        ],
    }


def npd_values(args: SelfHealingArgs) -> dict[str, Any]:
    return {
        "settings": {
            "custom_monitor_definitions": {
                PLUGIN_FILE: json.dumps(npd_plugin_config(args.slos), sort_keys=True)
            },
            "custom_plugin_monitors": [f"/custom-config/{PLUGIN_FILE}"],
        },
        "extraVolumes": [{"name": "gpufleet", "hostPath": {"path": GPUFLEET_HOST_DIR}}],
        "extraVolumeMounts": [{"name": "gpufleet", "mountPath": GPUFLEET_HOST_DIR, "readOnly": True}],
        "tolerations": args.tolerations,
    }


def nvsentinel_values(rem: RemediationSpec, tolerations: list[dict[str, str]]) -> dict[str, Any]:
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
            }
        },
    }


class SelfHealing(pulumi.ComponentResource):
    def __init__(self, name: str, args: SelfHealingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:healing:SelfHealing", name, None, opts)
        self.npd = helm_release(
            f"{name}-node-problem-detector", "node-problem-detector", npd_values(args), self
        )
        self.nvsentinel = helm_release(
            f"{name}-nvsentinel", "nvsentinel", nvsentinel_values(args.remediation, args.tolerations), self
        )
        self.register_outputs(
            {"mode": args.remediation.mode, "checkIntervalSeconds": health_check_interval_seconds(args.slos)}
        )
