"""The Grafana dashboard (JSON model) for GPU health, fabric and recovery, derived from the catalog.

kube-prometheus-stack's Grafana sidecar loads it from a ConfigMap labelled `grafana_dashboard: "1"`
(conventions.md). Panels query the same dcgm-exporter / node_exporter names as the alert rules; the
"alerts" row is built from the catalog so every alerting fault shows up by class.
"""

from __future__ import annotations

from typing import Any

from gpufleet.catalog.load import Catalog
from gpufleet.catalog.rules import DOMAINS, domain_of

UID = "gpufleet-health"
TITLE = "gpufleet / GPU health, fabric and recovery"
DASHBOARD_FILE = "monitoring/dashboards/gpufleet-health.json"
_DS = {"type": "prometheus", "uid": "${datasource}"}
_FABRIC_DEV = '(ib|rdma|fab|enp).*'

# (title, unit, [(expr, legend)]) per row; timeseries panels, two per line.
_ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("GPU health", [
        # DCGM_EXP_XID_ERRORS_COUNT is a count over the exporter's window, not a counter.
        ("XID events (in the exporter's window)", "short", [
            ('sum by (Hostname, xid) (DCGM_EXP_XID_ERRORS_COUNT{xid!=""}) > 0',
             "{{Hostname}} XID {{xid}}"),
        ]),
        ("Last XID per GPU (gauge; repeats invisible)", "short", [
            ("DCGM_FI_DEV_XID_ERRORS > 0", "{{Hostname}} GPU {{gpu}}"),
        ]),
        ("GPU temperature", "celsius", [("DCGM_FI_DEV_GPU_TEMP", "{{Hostname}} GPU {{gpu}}")]),
        ("GPU power", "watt", [("DCGM_FI_DEV_POWER_USAGE", "{{Hostname}} GPU {{gpu}}")]),
        ("ECC errors (1h)", "short", [
            ("increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[1h]) > 0", "SBE {{Hostname}} GPU {{gpu}}"),
            ("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h]) > 0", "DBE {{Hostname}} GPU {{gpu}}"),
        ]),
        ("Remapped rows / remap state", "short", [
            ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0", "uncorrectable {{Hostname}} GPU {{gpu}}"),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS > 0", "correctable {{Hostname}} GPU {{gpu}}"),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING > 0", "pending {{Hostname}} GPU {{gpu}}"),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", "failure {{Hostname}} GPU {{gpu}}"),
        ]),
        ("PCIe replays per minute", "short", [
            ("rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]) * 60", "{{Hostname}} GPU {{gpu}}"),
        ]),
        ("NVLink CRC flit errors per second", "short", [
            ("rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[5m])", "{{Hostname}} GPU {{gpu}}"),
        ]),
    ]),
    ("Fabric", [
        ("Ports not active", "short", [
            ("node_infiniband_state_id != 4", "{{instance}} {{device}}:{{port}}"),
            (f'node_network_up{{device=~"{_FABRIC_DEV}"}} == 0', "{{instance}} {{device}}"),
        ]),
        ("Carrier changes / link downed (10m)", "short", [
            (f'increase(node_network_carrier_changes_total{{device=~"{_FABRIC_DEV}"}}[10m]) > 0',
             "{{instance}} {{device}}"),
            ("increase(node_infiniband_link_downed_total[10m]) > 0", "{{instance}} {{device}}:{{port}}"),
        ]),
        ("Receive errors + transmit drops per second", "pps", [
            (f'rate(node_network_receive_errs_total{{device=~"{_FABRIC_DEV}"}}[5m])'
             f' + rate(node_network_transmit_drop_total{{device=~"{_FABRIC_DEV}"}}[5m])',
             "{{instance}} {{device}}"),
        ]),
        ("Symbol errors (10m)", "short", [
            ("increase(node_infiniband_symbol_error_total[10m])", "{{instance}} {{device}}:{{port}}"),
        ]),
    ]),
    ("Recovery", [
        ("Training step", "short", [("max by (job_name) (gpufleet_training_step)", "{{job_name}}")]),
        ("Samples per second", "short", [
            ("sum by (job_name) (gpufleet_training_samples_per_second)", "{{job_name}}"),
        ]),
        ("Steps since last checkpoint", "short", [
            ("max by (job_name) (gpufleet_training_step)"
             " - max by (job_name) (gpufleet_training_last_checkpoint_step)",
             "{{job_name}}"),
        ]),
        ("Restarts (1h)", "short", [
            ("max by (job_name) (increase(gpufleet_training_restarts_total[1h]))", "{{job_name}}"),
        ]),
    ]),
]


def _target(expr: str, legend: str, ref: int) -> dict[str, Any]:
    return {"datasource": _DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + ref)}


def dashboard(catalog: Catalog) -> dict[str, Any]:
    """The dashboard as a plain dict (Grafana JSON model, schemaVersion 39). Deterministic."""
    panels: list[dict[str, Any]] = []
    y = 0

    def add(panel: dict[str, Any], w: int, h: int, x: int) -> None:
        panel["id"] = len(panels) + 1
        panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        panels.append(panel)

    # Alerts row, from the catalog: firing alerts per domain, and a table by fault.
    add({"type": "row", "title": "Alerts (from the fault catalog)", "collapsed": False}, 24, 1, 0)
    y += 1
    by_domain: dict[str, list[str]] = {}
    for f in catalog:
        if f.alert is not None:
            by_domain.setdefault(domain_of(f, catalog), []).append(f.id)
    domains = [d for d in DOMAINS if d in by_domain]
    width = max(24 // max(len(domains), 1), 3)
    for i, d in enumerate(domains):
        ids = "|".join(by_domain[d])
        add({
            "type": "stat", "title": f"Firing: {d}", "datasource": _DS,
            "targets": [_target(f'count(ALERTS{{alertstate="firing", fault=~"{ids}"}}) or vector(0)', d, 0)],
            "fieldConfig": {"defaults": {"unit": "short", "thresholds": {"mode": "absolute", "steps": [
                {"color": "green", "value": None}, {"color": "red", "value": 1}]}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none"},
        }, width, 4, i * width)
    y += 4
    add({
        "type": "table", "title": "Firing alerts by fault and class", "datasource": _DS,
        "targets": [{**_target(
            'count by (alertname, fault, fault_class, severity) (ALERTS{alertstate="firing", fault!=""})',
            "", 0), "format": "table", "instant": True}],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
    }, 24, 6, 0)
    y += 6

    for row_title, row_panels in _ROWS:
        add({"type": "row", "title": row_title, "collapsed": False}, 24, 1, 0)
        y += 1
        for i, (title, unit, queries) in enumerate(row_panels):
            add({
                "type": "timeseries", "title": title, "datasource": _DS,
                "targets": [_target(e, leg, k) for k, (e, leg) in enumerate(queries)],
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
            }, 12, 8, (i % 2) * 12)
            if i % 2 == 1 or i == len(row_panels) - 1:
                y += 8

    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["gpufleet", "gpu", "fabric", "recovery"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Prometheus", "current": {}, "hide": 0, "refresh": 1,
        }]},
        "annotations": {"list": []},
        "panels": panels,
    }
