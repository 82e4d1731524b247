"""The fault catalog: data files with a typed loader, and the policies derived from them."""

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
