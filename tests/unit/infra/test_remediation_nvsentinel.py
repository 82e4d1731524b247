"""Every field of a stack's `remediation:` reaches NVSentinel's Helm values, or is refused with its
path (gpufleet.infra.self_healing, ADR 0038; NVSentinel docs/configuration/*.md and
data-models/protobufs/health_event.proto)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from infra_testdata import ROOT, variant
from typer.testing import CliRunner

from gpufleet.catalog import isolating_xids, load_catalog, xid_policy
from gpufleet.cli.main import app
from gpufleet.config.model import RemediationSpec
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.infra.offline import run_offline
from gpufleet.infra.self_healing import (
    NVSENTINEL_MONITORS,
    RECOMMENDED_ACTION,
    nvsentinel_values,
    remediation_problems,
    unapplied_overrides,
)

# enum RecommendedAction of NVSentinel's data-models/protobufs/health_event.proto.
PROTO_ACTIONS = {
    "NONE", "COMPONENT_RESET", "CONTACT_SUPPORT", "RUN_FIELDDIAG", "RESTART_VM", "RESTART_BM",
    "REPLACE_VM", "RUN_DCGMEUD", "RESTART_APP", "UNKNOWN",
}

POLICY: dict[str, Any] = {
    "mode": "cordon-drain-remediate",
    "detection": {"gpu-fatal": "active", "fabric-degraded": "active", "gpu-contained": "passive"},
    "circuitBreaker": {"maxQuarantinedShare": 0.021, "windowMinutes": 7.5},
    "xidOverrides": {
        13: {"action": "reboot-node", "faultClass": "gpu-fatal", "reason": "flaky SM on this SKU"},
        31: {"action": "restart-job", "reason": "our jobs fault their own memory"},
        79: {"action": "replace", "reason": "fallen off the bus twice means RMA here"},
    },
}


def resolved(policy: dict[str, Any]) -> tuple[RemediationSpec, dict[int, Any]]:
    rem = RemediationSpec.model_validate(policy)
    table, problems = xid_policy(load_catalog(), rem.xid_overrides)
    assert problems == []
    return rem, table


def test_every_ladder_rung_has_an_nvsentinel_action() -> None:
    assert set(RECOMMENDED_ACTION) == set(LadderAction)
    assert set(RECOMMENDED_ACTION.values()) <= PROTO_ACTIONS


def test_every_field_of_the_policy_arrives_in_the_values() -> None:
    rem, table = resolved(POLICY)
    values = nvsentinel_values(rem, [{"key": "nvidia.com/gpu", "operator": "Exists"}], table)
    g = values["global"]
    # mode
    assert g["dryRun"] is False and g["faultQuarantine"] == {"enabled": True}
    assert g["nodeDrainer"] == {"enabled": True} and g["faultRemediation"] == {"enabled": True}
    # circuitBreaker: 2.1 % -> 3 (whole percent, rounded up), 7.5 min -> 450 s
    breaker = values["fault-quarantine"]["circuitBreaker"]
    assert breaker == {"enabled": True, "percentage": 3, "duration": "450s"}
    # detection: the active classes' monitors on; a passive class switches nothing
    assert g["gpuHealthMonitor"] == {"enabled": True} and g["syslogHealthMonitor"] == {"enabled": True}
    assert g["nicHealthMonitor"] == {"enabled": True}  # fabric-degraded: link_error_recovery etc.
    # xidOverrides: the cordon rule set follows the resolved actions ...
    cordon = next(r for r in values["fault-quarantine"]["ruleSets"] if r["name"] == "gpufleet-isolating-xids")
    expression = cordon["match"]["all"][0]["expression"]
    assert "'13'" in expression and "'79'" in expression and "'31'" not in expression
    listed = expression.split("e in [")[1].split("]")[0]
    assert listed == ", ".join(f"'{x}'" for x in isolating_xids(table))
    # ... and the platform connector rewrites each overridden XID's HealthEvent
    pc = values["platformConnector"]
    assert [s["name"] for s in pc["pipeline"]] == ["MetadataAugmentor", "OverrideTransformer"]
    assert next(s for s in pc["pipeline"] if s["name"] == "OverrideTransformer")["enabled"] is True
    listed_rules = pc["transformers"]["OverrideTransformer"]["rules"]
    rules: dict[str, dict[str, Any]] = {r["when"]: r for r in listed_rules}

    def when(xid: int) -> str:
        return f'event.agent == "syslog-health-monitor" && "{xid}" in event.errorCode'

    assert set(rules) == {when(x) for x in (13, 31, 79)}

    def rule(xid: int) -> dict[str, Any]:
        return rules[when(xid)]

    assert rule(13)["override"] == {"isFatal": True, "recommendedAction": "RESTART_BM"}
    assert rule(31)["override"] == {"isFatal": False, "recommendedAction": "RESTART_APP"}
    assert rule(79)["override"] == {"isFatal": True, "recommendedAction": "CONTACT_SUPPORT"}
    # reason: carried in the rule's name (NVSentinel logs it when the rule applies)
    assert rule(13)["name"] == "gpufleet-xid-13: flaky SM on this SKU"
    # faultClass: 13 becomes gpu-fatal here, which is what makes it isolating (isFatal, cordon)
    assert table[13].fault_class is FaultClass.GPU_FATAL


@pytest.mark.parametrize(
    ("mode", "dry", "drain"),
    [("monitor-only", True, False), ("cordon", False, False), ("cordon-drain-remediate", False, True)],
)
def test_mode_switches_the_modules(mode: str, dry: bool, drain: bool) -> None:
    rem, table = resolved({"mode": mode})
    g = nvsentinel_values(rem, [], table)["global"]
    assert (g["dryRun"], g["nodeDrainer"]["enabled"], g["faultRemediation"]["enabled"]) == (dry, drain, drain)


def test_without_overrides_or_active_detection_the_chart_defaults_stay() -> None:
    rem, table = resolved({"detection": {"gpu-fatal": "passive"}})
    values = nvsentinel_values(rem, [], table)
    assert "platformConnector" not in values
    assert not {m for ms in NVSENTINEL_MONITORS.values() for m in ms} & set(values["global"])


def test_attempt_caps_are_refused_with_their_path() -> None:
    assert remediation_problems(RemediationSpec(), nvidia=True) == []
    (p,) = remediation_problems(RemediationSpec.model_validate({"attemptCaps": {"resetGpu": 3}}), nvidia=True)
    assert p.path == "remediation.attemptCaps" and "NVSentinel has no such setting" in p.message


def test_active_detection_needs_a_detector_the_stack_deploys() -> None:
    def paths(detection: dict[str, str], nvidia: bool) -> list[str]:
        rem = RemediationSpec.model_validate({"detection": detection})
        return [p.path for p in remediation_problems(rem, nvidia)]

    everywhere = {"node-crash": "active", "node-hang": "active", "fabric-link-down": "active"}
    assert paths(everywhere, nvidia=False) == []
    assert paths({"gpu-fatal": "active", "fabric-flap": "active"}, nvidia=True) == []
    assert paths({"gpu-fatal": "active"}, nvidia=False) == ["remediation.detection.gpu-fatal"]
    assert paths({"storage-outage": "active", "workload": "passive"}, nvidia=True) == [
        "remediation.detection.storage-outage"
    ]


def test_a_conflicting_override_left_out_of_the_table_is_named() -> None:
    rem = RemediationSpec.model_validate(
        {"xidOverrides": {79: {"action": "none", "faultClass": "gpu-fatal", "reason": "x"}}}
    )
    table, conflicts = xid_policy(load_catalog(), rem.xid_overrides)
    assert conflicts  # gpu-fatal with an action that does not isolate
    assert [p.path for p in unapplied_overrides(rem, table)] == ["remediation.xidOverrides.79"]


def test_the_program_gives_nvsentinel_the_overrides() -> None:
    spec = variant(
        "h200-ib",
        lambda d: d["remediation"].update(
            xidOverrides={"13": {"action": "reboot-node", "faultClass": "gpu-fatal", "reason": "flaky SM"}},
        ),
    )
    view = run_offline(spec, "overrides")
    (nvs,) = [r for r in view.of_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "nvsentinel"]
    (rule,) = nvs.inputs["values"]["platformConnector"]["transformers"]["OverrideTransformer"]["rules"]
    assert rule["override"] == {"isFatal": True, "recommendedAction": "RESTART_BM"}
    (cm,) = [
        r
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
        if r.inputs["metadata"]["name"] == "gpufleet-remediation-policy"
    ]
    policy = json.loads(cm.inputs["data"]["policy.json"])
    assert policy["xids"]["13"]["nvsentinelAction"] == "RESTART_BM" and "attemptCaps" not in policy


def test_the_program_refuses_active_detection_nothing_deploys() -> None:
    spec = variant("h200-ib", lambda d: d["remediation"].update(detection={"storage-outage": "active"}))
    with pytest.raises(pulumi.RunError, match=r"remediation\.detection\.storage-outage: no detector"):
        run_offline(spec, "nodetector")


def test_validate_refuses_attempt_caps_naming_file_and_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.b200-roce.yaml").read_text())
    doc["config"]["gpufleet:remediation"]["attemptCaps"] = {"resetGpu": 3, "rebootNode": 1}
    bad = tmp_path / "Pulumi.caps.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert f"{bad}" in out and "remediation.attemptCaps: nothing the platform deploys enforces" in out
    assert "Traceback" not in result.output


def test_the_program_says_when_nothing_enforces_the_policy(caplog: pytest.LogCaptureFixture) -> None:
    """Non-NVIDIA stacks get no NVSentinel; explicit attempt caps are not enforced: both warned of
    (pulumi.log.warn, which the mock engine hands to Python logging)."""
    caplog.set_level(logging.WARNING)
    run_offline(variant("mi300x-roce", lambda d: d["remediation"].update(attemptCaps={"resetGpu": 3})), "amd")
    text = caplog.text
    assert "no NVIDIA GPUs, so no NVSentinel" in text
    assert "remediation.attemptCaps: nothing the platform deploys enforces" in text
