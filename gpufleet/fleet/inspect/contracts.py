"""What the schedulers consume (pure): node-problem-detector's custom-plugin contract and Slurm's
HealthCheckProgram, the same two gpufleet.health speaks.

- node-problem-detector custom plugin: exit 0 OK, 1 problem (NonOK), 2 unknown; the message is
  stdout, cut to the plugin's max_output_length (80 by default, NPD docs/custom_plugin_monitor.md).
- Slurm HealthCheckProgram: Slurm ignores its exit code; the program drains the node itself with
  `scontrol update nodename=<n> state=drain reason=<reason>`: `drain_reason` is that reason.
A warning keeps the node in service (exit 0) and still names its code in the message.
"""

from __future__ import annotations

from gpufleet.fleet.inspect.checks import NodeResult
from gpufleet.fleet.inspect.codes import Severity

EXIT_CODES = {"ok": 0, "warn": 0, "fail": 1, "unknown": 2}
NPD_MAX_OUTPUT = 80


def exit_code(result: NodeResult) -> int:
    return EXIT_CODES[result.status]


def npd_message(result: NodeResult, limit: int = NPD_MAX_OUTPUT) -> str:
    fails = [f for f in result.findings if f.severity is Severity.FAIL]
    warns = [f for f in result.findings if f.severity is Severity.WARN]
    if fails:
        f = fails[0]
        more = f" (+{len(fails) - 1})" if len(fails) > 1 else ""
        text = f"PROBLEM: {f.code} {f.name} {f.subject}{more}"
    elif result.status == "unknown":
        text = f"UNKNOWN: {result.unknown[0]}"
    elif warns:
        text = "OK: warn " + " ".join(sorted({f.code for f in warns}))
    else:
        text = "OK: gpufleet inspect checks pass"
    return text[:limit]


def drain_reason(result: NodeResult) -> str | None:
    """The Slurm drain reason for a failing node (None: leave it in service)."""
    fails = [f for f in result.findings if f.severity is Severity.FAIL]
    if not fails:
        return None
    codes = ",".join(sorted({f.code for f in fails}))
    return f"gpufleet inspect {codes}: {fails[0].name} {fails[0].subject}"
