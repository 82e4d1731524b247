"""The fault catalog: data files with a typed loader, and the policies derived from them.

Names are imported on first use (PEP 562): the node health check imports this package every
HealthCheckInterval on every node, and needs the loader and the policy, not the dashboard or the
rule renderer (jinja2), which were a fifth of its start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.catalog.dashboard import dashboard
    from gpufleet.catalog.injection import (
        INJECTION_MODELS,
        AnyInjection,
        Capabilities,
        Injection,
        InjectionModel,
        parse_injection,
    )
    from gpufleet.catalog.load import DATA_DIR, Catalog, load_catalog, parse_catalog_file
    from gpufleet.catalog.model import Alert, Fault, HealthCheck, Rate, runbook_url
    from gpufleet.catalog.policy import (
        Observation,
        OverrideSpec,
        XidRule,
        actionable,
        escalated_action,
        isolating_xids,
        xid_policy,
    )
    from gpufleet.catalog.rules import RUNBOOK_BASE, rule_groups

_HOME = {
    "dashboard": "dashboard",
    **dict.fromkeys(("INJECTION_MODELS", "AnyInjection", "Capabilities", "Injection", "InjectionModel",
                     "parse_injection"), "injection"),
    **dict.fromkeys(("DATA_DIR", "Catalog", "load_catalog", "parse_catalog_file"), "load"),
    **dict.fromkeys(("Alert", "Fault", "HealthCheck", "Rate", "runbook_url"), "model"),
    **dict.fromkeys(("Observation", "OverrideSpec", "XidRule", "actionable", "escalated_action",
                     "isolating_xids", "xid_policy"), "policy"),
    **dict.fromkeys(("RUNBOOK_BASE", "rule_groups"), "rules"),
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DATA_DIR",
    "INJECTION_MODELS",
    "RUNBOOK_BASE",
    "Alert",
    "AnyInjection",
    "Capabilities",
    "Catalog",
    "Fault",
    "HealthCheck",
    "Injection",
    "InjectionModel",
    "Observation",
    "OverrideSpec",
    "Rate",
    "XidRule",
    "actionable",
    "dashboard",
    "escalated_action",
    "isolating_xids",
    "load_catalog",
    "parse_catalog_file",
    "parse_injection",
    "rule_groups",
    "runbook_url",
    "xid_policy",
]
