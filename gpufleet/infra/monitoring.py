"""Monitoring: kube-prometheus-stack, the catalog's alert rules as PrometheusRule CRs, and the
Grafana dashboard as a ConfigMap the Grafana sidecar loads (label `grafana_dashboard: "1"`).

The `*SelectorNilUsesHelmValues: false` switches make Prometheus pick up every PrometheusRule and
ServiceMonitor in the cluster (the GPU Operator's DCGM ServiceMonitor included), not only those
labelled with this release (kube-prometheus-stack values.yaml).

Every ServiceMonitor the rules join across (node-exporter here, dcgm-exporter in gpu_software) adds
the scraped pod's node name as label `node` (`NODE_RELABELING`): the one host label GPU, node and
fabric rules share (ADR 0040). The rules are rendered for the stack (`rule_settings`): its declared
HCAs, rails and link speed, and its slowest scrape interval for the alerts one scrape must not page.

Grafana's admin login comes from a Secret the program declares (`grafana.admin.existingSecret`,
`userKey`, `passwordKey` of the grafana subchart), never the chart's default `prom-operator`
(`grafana.adminPassword` in kube-prometheus-stack values.yaml); a stack without a password gets no
Grafana (`gpufleet validate` refuses that outside the sandbox).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import ValidationError

from gpufleet.catalog.detection import (
    ALL_HEALTH_SOURCES,
    ExporterTiming,
    PathSettings,
    budget_problems,
    routing_problems,
    used_severities,
)
from gpufleet.catalog.exporters import DCGM_EXPORTER, load_exporters
from gpufleet.catalog.load import load_catalog
from gpufleet.catalog.rules import RUNBOOK_BASE, RuleSettings, rule_groups
from gpufleet.config.model import MonitoringSpec, SchedulerKind, StackSpec, duration_seconds
from gpufleet.core.errors import Problem
from gpufleet.infra.charts import CHARTS, chart_install, chart_namespace, custom_resource
from gpufleet.infra.common import MANAGED_BY, child, secret_input
from gpufleet.infra.npd_check import NPD_HEALTH_SOURCES

# prometheus-operator RelabelConfig: the target pod's node name into `node` (kube-prometheus-stack
# 72.6.2 values.yaml shows the same source label under prometheus-node-exporter.prometheus.monitor).
NODE_RELABELING: list[dict[str, Any]] = [
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
]
# The node's leaf group (gpufleet.config.placement.LEAF_LABEL, gpufleet.io/leaf) as label `leaf`, from
# the node metadata a monitor attaches (`attachMetadata.node`, Prometheus' attach_metadata; its
# label name sanitised as Prometheus does): FabricSwitchDown groups by it.
LEAF_RELABELING: list[dict[str, Any]] = [
    {"sourceLabels": ["__meta_kubernetes_node_label_gpufleet_io_leaf"], "targetLabel": "leaf",
     "action": "replace"}
]
# The sandbox names its fabric links fab<rail> (gpufleet.sandbox.layout); a unit test holds the two equal.
SANDBOX_FABRIC_PREFIX = "fab"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
GRAFANA_SECRET = "grafana-admin"
RELEASE = "kube-prometheus-stack"


def rule_settings(spec: StackSpec) -> RuleSettings:
    """What the catalog's rules need to know about this stack. On a sandbox the fabric ports are
    its veth links fab<rail>, also seen as netdevs; on a cluster the declared HCAs (`fabric.hcas`,
    else mlx5_<rail>), whose netdev names the stack does not declare. The debounce interval is the
    slowest scrape interval of what the rules read (dcgm-exporter's collect interval is set to its
    scrape interval, gpu_software)."""
    sandbox = spec.cluster.environment.value == "sandbox"
    rails = spec.fabric.rails_per_node
    devices = [f"{SANDBOX_FABRIC_PREFIX}{i}" for i in range(rails)] if sandbox else spec.fabric.hca_names()
    mon = spec.monitoring
    slowest = max(duration_seconds(mon.scrape_interval), duration_seconds(mon.dcgm_scrape_interval))
    return RuleSettings(
        runbook_base=mon.runbook_base_url if mon.runbook_base_url is not None else RUNBOOK_BASE,
        scrape_interval_s=slowest,
        fabric_devices=tuple(devices),
        fabric_netdevs=f"{SANDBOX_FABRIC_PREFIX}[0-9]+" if sandbox else None,
        link_speed_gbps=float(spec.fabric.link_speed_gbps),
    )


def path_settings(spec: StackSpec) -> PathSettings:
    """What the detection path of this stack's alerts is made of (gpufleet.catalog.detection). On a
    sandbox: its own Prometheus scrapes every target at `sandbox.scrapeInterval`, its node agents and
    training job render their values at the scrape, and there is no Alertmanager (the game-day
    measures the first firing ALERTS sample). On a cluster: dcgm-exporter and AMD's exporter at
    `dcgmScrapeInterval` (dcgm-exporter's own loop set to it, gpu_software), the rest at
    `scrapeInterval`, and the group_wait of the route each severity takes."""
    mon = spec.monitoring
    exporters = load_exporters().exporters
    sandbox = spec.cluster.environment.value == "sandbox"
    timings: dict[str, ExporterTiming] = {}
    for name, ex in exporters.items():
        if sandbox and not (ex.sandbox or (ex.storage_sandbox and spec.storage.ceph is not None)):
            continue  # not run in the sandbox: its alerts cannot fire there (detection.can_fire)
        if sandbox:
            # The sandbox's Prometheus scrapes everything at sandbox.scrapeInterval (sandbox.layout).
            timings[name] = ExporterTiming(0.0, "the sandbox's exporters render at the scrape",
                                           spec.sandbox_scrape_seconds, "sandbox.scrapeInterval")
            continue
        fast = name in (DCGM_EXPORTER, "amd-device-metrics-exporter")
        scrape_key = "dcgmScrapeInterval" if fast else "scrapeInterval"
        scrape_s = duration_seconds(mon.dcgm_scrape_interval if fast else mon.scrape_interval)
        ci = ex.collection_interval
        if ci == "scrape":
            timing = ExporterTiming(0.0, "read when scraped, exporters.yaml", scrape_s, scrape_key)
        elif ci == "dcgmScrapeInterval":
            timing = ExporterTiming(duration_seconds(mon.dcgm_scrape_interval),
                                    "DCGM_EXPORTER_INTERVAL = dcgmScrapeInterval", scrape_s, scrape_key)
        elif ci == "unknown":
            timing = ExporterTiming(None, "its own interval, not pinned in exporters.yaml",
                                    scrape_s, scrape_key)
        else:
            timing = ExporterTiming(duration_seconds(ci), "its own interval, exporters.yaml",
                                    scrape_s, scrape_key)
        timings[name] = timing
    waits: dict[str, tuple[float, str]] | None = None
    if not sandbox:
        waits = {}
        for sev in ("critical", "warning", "info"):
            route = next((r for r in mon.alert_routes if r.severity == sev), None)
            if route is not None and route.group_wait is not None:
                waits[sev] = (duration_seconds(route.group_wait), f"alertRoutes[{sev}].groupWait")
            else:
                waits[sev] = (duration_seconds(mon.group_wait), "monitoring.groupWait")
    return PathSettings(
        exporters=timings, evaluation_s=duration_seconds(mon.evaluation_interval),
        evaluation_source="monitoring.evaluationInterval", group_wait_s=waits,
        rules=rule_settings(spec),
        vendors=frozenset(v.value for v in spec.vendors),
        health_sources=ALL_HEALTH_SOURCES if sandbox or spec.scheduler.kind == SchedulerKind.SLURM
        else NPD_HEALTH_SOURCES)


def detection_budget_problems(spec: StackSpec) -> list[Problem]:
    """A problem per detect budget shorter than the worst-case detection path of an alert that binds
    it (gpufleet.catalog.detection.budget_alerts), each term of the sum named (ADR 0044); per
    `slos.faultBudgets` entry that binds nothing, or whose keys merged into its class's budget
    break detect <= isolate <= recover (ADR 0046)."""
    slos, catalog = spec.slos, load_catalog()
    detect = {cls: b.detect_seconds for cls, b in slos.budgets.items()}
    classes = {f.id: f.fault_class for f in catalog}
    own: dict[str, float] = {}
    out: list[Problem] = []
    for fid, override in sorted(slos.fault_budgets.items()):
        at, cls = f"slos.faultBudgets.{fid}", classes.get(fid)
        if cls is None:
            out.append(Problem(at, "not a fault of the catalog"))
            continue
        if cls not in slos.budgets:
            out.append(Problem(at, f"its class {cls.value} has no budget in slos.budgets to replace keys of"))
            continue
        try:
            merged = slos.budget_of(fid, cls)
        except ValidationError as e:
            out.extend(Problem(at, f"merged into slos.budgets.{cls.value}: {err['msg']}")
                       for err in e.errors())
            continue
        if merged is not None and override.detect_seconds is not None:
            own[fid] = merged.detect_seconds
    out += budget_problems(catalog, load_exporters(), detect, path_settings(spec), own)
    return out


def alert_routing_problems(spec: StackSpec) -> list[Problem]:
    """A problem per severity the stack's rules use that reaches no receiver and that the stack does
    not list in `monitoring.notPagedSeverities` (ADR 0044)."""
    mon = spec.monitoring
    used = used_severities(rule_groups(load_catalog(), rule_settings(spec)))
    return routing_problems(used, [(r.severity, r.receiver) for r in mon.alert_routes],
                            mon.not_paged_severities)


def grafana_enabled(mon: MonitoringSpec) -> bool:
    return mon.grafana and mon.grafana_admin_password is not None


def service_endpoints(release: str, namespace: str, grafana: bool) -> dict[str, str]:
    """In-cluster URLs of the chart's Services (`<fullname>-prometheus`, `-alertmanager`, and the
    grafana subchart's `<release>-grafana`, kube-prometheus-stack templates)."""
    out = {
        "prometheus": f"http://{release}-prometheus.{namespace}.svc:9090",
        "alertmanager": f"http://{release}-alertmanager.{namespace}.svc:9093",
    }
    if grafana:
        out["grafana"] = f"http://{release}-grafana.{namespace}.svc:80"
    return out


@dataclass(frozen=True)
class MonitoringArgs:
    monitoring: MonitoringSpec
    rule_groups: list[dict[str, Any]]  # Prometheus rule groups ({name, rules}) generated from the catalog
    dashboard: dict[str, Any] | None  # Grafana dashboard JSON model generated from the catalog
    # The port of AMD's device-metrics-exporter when the stack runs it (AMD GPU Operator), else None.
    amd_exporter_port: int | None = None


# AMD's DeviceConfig (operator v1.2.0) has no ServiceMonitor switch: a PodMonitor selects the exporter's
# pods by the label the operator's docs list them with (docs/metrics/exporter.md at v1.2.0).
AMD_EXPORTER_POD_LABELS = {"app.kubernetes.io/name": "metrics-exporter"}
AMD_EXPORTER_NAMESPACE = CHARTS["amd-gpu-operator"].namespace


def amd_exporter_pod_monitor_spec(port: int, scrape_interval: str) -> dict[str, Any]:
    """prometheus-operator PodMonitor for AMD's device-metrics-exporter (plain HTTP on the
    DeviceConfig's port: no kube-rbac-proxy is configured), with the `node` label the rules join on."""
    return {
        "selector": {"matchLabels": AMD_EXPORTER_POD_LABELS},
        "namespaceSelector": {"matchNames": [AMD_EXPORTER_NAMESPACE]},
        "podMetricsEndpoints": [
            {"portNumber": port, "path": "/metrics", "interval": scrape_interval,
             "relabelings": NODE_RELABELING}
        ],
    }


def alert_count(groups: list[dict[str, Any]]) -> int:
    return sum(1 for g in groups for r in g.get("rules", []) if "alert" in r)


# A cause silences its echoes on the same host or rail (Alertmanager inhibit_rules): a node that
# stopped answering explains its GPU and fabric alerts; a switch down explains its ports down; an
# XID 79 explains the GPU missing afterwards.
INHIBIT_RULES: list[dict[str, Any]] = [
    {"source_matchers": ['alertname="NodeDown"'], "target_matchers": ['alertname!="NodeDown"'],
     "equal": ["node"]},
    {"source_matchers": ['alertname="FabricSwitchDown"'], "target_matchers": ['alertname="FabricPortDown"'],
     "equal": ["leaf", "device"]},
    {"source_matchers": ['alertname="GpuFallenOffBus"'], "target_matchers": ['alertname="GpuMissing"'],
     "equal": ["node"]},
]


def alertmanager_config(mon: MonitoringSpec) -> dict[str, Any]:
    """Routes by severity to the declared receivers, grouped per alert and host (`node`, the label
    every host-level rule carries). Receivers are declared by name only: their integrations
    (PagerDuty keys, Slack webhooks) are credentials the operator adds as an AlertmanagerConfig,
    never stack values."""
    receivers = sorted({r.receiver for r in mon.alert_routes})
    return {
        "inhibit_rules": INHIBIT_RULES,
        "route": {
            "receiver": "null",
            "group_by": ["alertname", "node"],
            "group_wait": mon.group_wait,
            "routes": [
                {
                    "receiver": r.receiver,
                    "matchers": [f'severity="{r.severity}"'],
                    "repeat_interval": r.repeat_interval,
                    **({"group_wait": r.group_wait} if r.group_wait is not None else {}),
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
        "prometheus-node-exporter": {
            "prometheus": {
                "monitor": {
                    "relabelings": NODE_RELABELING + LEAF_RELABELING,
                    "attachMetadata": {"node": True},
                }
            }
        },
        "grafana": {
            "enabled": grafana_enabled(mon),
            "admin": {
                "existingSecret": GRAFANA_SECRET,
                "userKey": "admin-user",
                "passwordKey": "admin-password",
            },
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
        ns = CHARTS[RELEASE].namespace
        mon = args.monitoring
        namespace = chart_namespace(f"{name}-kube-prometheus-stack", RELEASE, self)
        deps: list[pulumi.Resource] = []
        if grafana_enabled(mon):
            assert mon.grafana_admin_password is not None
            deps.append(
                k8s.core.v1.Secret(
                    f"{name}-grafana-admin",
                    metadata={"name": GRAFANA_SECRET, "namespace": ns, "labels": MANAGED_BY},
                    string_data={
                        "admin-user": "admin",
                        "admin-password": secret_input(mon.grafana_admin_password),
                    },
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        depends_on=[namespace] if namespace is not None else [],
                        additional_secret_outputs=["data", "stringData"],
                    ),
                )
            )
        stack = chart_install(
            f"{name}-kube-prometheus-stack",
            RELEASE,
            prometheus_stack_values(mon),
            self,
            deps,
            namespace=namespace,
        )
        self.prometheus_stack = stack.release
        # Derived from the release as deployed (its name and namespace outputs); none without it.
        self.endpoints: pulumi.Output[dict[str, str]] = (
            pulumi.Output.all(stack.release.name, stack.release.namespace).apply(
                lambda a: service_endpoints(str(a[0]), str(a[1]), grafana_enabled(mon))
            )
            if stack.release is not None
            else pulumi.Output.from_input({})
        )
        for group in args.rule_groups:
            obj = rule_resource_name(str(group["name"]))
            custom_resource(
                f"{name}-{obj}",
                "monitoring.coreos.com/v1",
                "PrometheusRule",
                {"name": obj, "namespace": ns, "labels": {**MANAGED_BY, "role": "alert-rules"}},
                {"groups": [group]},
                child(self, stack.ready),
            )
        if args.amd_exporter_port is not None:
            custom_resource(
                f"{name}-amd-metrics-exporter",
                "monitoring.coreos.com/v1",
                "PodMonitor",
                {"name": "amd-metrics-exporter", "namespace": AMD_EXPORTER_NAMESPACE, "labels": MANAGED_BY},
                amd_exporter_pod_monitor_spec(args.amd_exporter_port, mon.dcgm_scrape_interval),
                child(self, stack.ready),
            )
        if args.dashboard is not None and grafana_enabled(mon):
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard",
                metadata={
                    "name": "gpufleet-dashboard",
                    "namespace": ns,
                    "labels": {**MANAGED_BY, **DASHBOARD_LABEL},
                },
                data={"gpufleet.json": json.dumps(args.dashboard, sort_keys=True)},
                opts=child(self, stack.ready),
            )
        self.alerts = alert_count(args.rule_groups)
        self.register_outputs(
            {"alerts": self.alerts, "ruleGroups": len(args.rule_groups), "endpoints": self.endpoints}
        )
