"""Monitoring: kube-prometheus-stack, the catalog's alert rules as PrometheusRule CRs, and the
Grafana dashboard as a ConfigMap the Grafana sidecar loads (label `grafana_dashboard: "1"`).

The `*SelectorNilUsesHelmValues: false` switches make Prometheus pick up every PrometheusRule and
ServiceMonitor in the cluster (the GPU Operator's DCGM ServiceMonitor included), not only those
labelled with this release (kube-prometheus-stack values.yaml).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config.model import MonitoringSpec
from gpufleet.infra.charts import CHARTS, helm_release
from gpufleet.infra.common import MANAGED_BY, child

DASHBOARD_LABEL = {"grafana_dashboard": "1"}


@dataclass(frozen=True)
class MonitoringArgs:
    monitoring: MonitoringSpec
    rule_groups: list[dict[str, Any]]  # Prometheus rule groups ({name, rules}) generated from the catalog
    dashboard: dict[str, Any] | None  # Grafana dashboard JSON model generated from the catalog


def alert_count(groups: list[dict[str, Any]]) -> int:
    return sum(1 for g in groups for r in g.get("rules", []) if "alert" in r)


def alertmanager_config(mon: MonitoringSpec) -> dict[str, Any]:
    """Routes by severity to the declared receivers. Receivers are declared by name only: their
    integrations (PagerDuty keys, Slack webhooks) are credentials the operator adds as an
    AlertmanagerConfig, never stack values."""
    receivers = sorted({r.receiver for r in mon.alert_routes})
    return {
        "route": {
            "receiver": "null",
            "group_by": ["alertname", "Hostname"],
            "routes": [
                {
                    "receiver": r.receiver,
                    "matchers": [f'severity="{r.severity}"'],
                    "repeat_interval": r.repeat_interval,
                }
                for r in mon.alert_routes
            ],
        },
        "receivers": [{"name": "null"}, *({"name": r} for r in receivers)],
    }


def prometheus_stack_values(mon: MonitoringSpec) -> dict[str, Any]:
    return {
        "prometheus": {
            "prometheusSpec": {
                "retention": mon.retention,
                "scrapeInterval": mon.scrape_interval,
                "evaluationInterval": mon.evaluation_interval,
                "ruleSelectorNilUsesHelmValues": False,
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
            }
        },
        "alertmanager": {"config": alertmanager_config(mon)},
        "grafana": {
            "enabled": mon.grafana,
            "sidecar": {
                "dashboards": {
                    "enabled": True,
                    "label": "grafana_dashboard",
                    "labelValue": "1",
                    "searchNamespace": "ALL",
                }
            },
        },
    }


def rule_resource_name(group_name: str) -> str:
    """A Kubernetes object name for a rule group (DNS-1123: lower case, digits, dashes)."""
    slug = re.sub(r"[^a-z0-9]+", "-", group_name.lower()).strip("-") or "rules"
    return slug if slug.startswith("gpufleet-") else f"gpufleet-{slug}"


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:monitoring:Monitoring", name, None, opts)
        ns = CHARTS["kube-prometheus-stack"].namespace
        self.prometheus_stack = helm_release(
            f"{name}-kube-prometheus-stack",
            "kube-prometheus-stack",
            prometheus_stack_values(args.monitoring),
            self,
        )
        for group in args.rule_groups:
            obj = rule_resource_name(str(group["name"]))
            k8s.apiextensions.CustomResource(
                f"{name}-{obj}",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={"name": obj, "namespace": ns, "labels": {**MANAGED_BY, "role": "alert-rules"}},
                spec={"groups": [group]},
                opts=child(self, [self.prometheus_stack]),
            )
        if args.dashboard is not None and args.monitoring.grafana:
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard",
                metadata={
                    "name": "gpufleet-dashboard",
                    "namespace": ns,
                    "labels": {**MANAGED_BY, **DASHBOARD_LABEL},
                },
                data={"gpufleet.json": json.dumps(args.dashboard, sort_keys=True)},
                opts=child(self, [self.prometheus_stack]),
            )
        self.alerts = alert_count(args.rule_groups)
        self.register_outputs({"alerts": self.alerts, "ruleGroups": len(args.rule_groups)})
