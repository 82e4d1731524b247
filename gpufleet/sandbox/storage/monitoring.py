"""The storage sandbox's monitoring: the exporters a Ceph cluster has in production, and a Prometheus
that evaluates the catalog's rules over them, all on 127.0.0.1. Pure functions; ceph.py starts them.

- Ceph's own exporter: the ceph-mgr `prometheus` module (Rook enables the same module on a
  cluster; exporters.yaml `ceph-mgr`), bound to 127.0.0.1 and with its cache off, so it collects
  at each scrape like the sandbox's other exporters (mgr/prometheus/cache, module.py of Debian 12's
  ceph-mgr-modules-core 16.2.15).
- The object store's probe: Debian's prometheus-blackbox-exporter, `http_2xx` against radosgw, as
  the scrape job `gpufleet-object-store` the catalog's StorageObjectStoreDown reads.
- The JuiceFS metadata engine's probe (when the stack has JuiceFS): the same blackbox exporter
  speaking Redis's protocol to it (`PING`, answer `+PONG`), as the scrape job
  `gpufleet-metadata-engine` the catalog's StorageMetadataEngineDown reads.
- The JuiceFS mount's own metrics (juicefs_*), scraped as job `gpufleet-juicefs-client`: they go
  with the mount's client, which the catalog's StorageJuicefsClientDown reads (`up == 0`).
- Prometheus (Debian's), with the rule file generated from the catalog (monitoring/rules/), at the
  stack's sandbox scrape interval and evaluation interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.sandbox.configs import prom_duration

# Scrape jobs; the catalog's rules name OBJECT_STORE_JOB (storage.yaml, StorageObjectStoreDown).
CEPH_JOB = "ceph"
OBJECT_STORE_JOB = "gpufleet-object-store"
BLACKBOX_MODULE = "http_2xx"
METADATA_ENGINE_JOB = "gpufleet-metadata-engine"
JUICEFS_CLIENT_JOB = "gpufleet-juicefs-client"  # the mount's own metrics (StorageJuicefsClientDown)
REDIS_MODULE = "redis_ping"
# Processes, as recorded in the storage sandbox's state file.
PROMETHEUS = "prometheus"
BLACKBOX = "blackbox-exporter"
PROMETHEUS_BIN = "prometheus"
BLACKBOX_BIN = "prometheus-blackbox-exporter"
PORT_NAMES = ("mgr-prometheus", "blackbox", "prometheus")


@dataclass(frozen=True)
class MonitoringPlan:
    scrape_s: float  # the stack's sandbox scrape interval
    evaluation_s: float  # monitoring.evaluationInterval
    rule_file: Path  # the catalog's generated rules
    # The stack has JuiceFS: probe its metadata engine (ports["redis"]) and scrape the mount's
    # metrics (ports["juicefs-metrics"]).
    metadata_engine: bool = False


def mgr_module_settings(plan: MonitoringPlan, ports: dict[str, int]) -> list[tuple[str, str]]:
    """`ceph config set mgr <key> <value>` for the prometheus module, set before it is enabled (the
    module reads them when it starts). Its scrape_interval matches Prometheus's, as Ceph's
    documentation asks (mgr/prometheus, Pacific), though with the cache off it only paces the
    module's background collection."""
    return [
        ("mgr/prometheus/server_addr", "127.0.0.1"),
        ("mgr/prometheus/server_port", str(ports["mgr-prometheus"])),
        ("mgr/prometheus/cache", "false"),
        ("mgr/prometheus/scrape_interval", f"{plan.scrape_s:g}"),
    ]


def blackbox_config(timeout_s: float) -> dict[str, Any]:
    """An HTTP GET that must answer 2xx (radosgw answers `GET /` with its bucket list), and a TCP
    exchange in Redis's inline protocol: PING must be answered +PONG (a Redis that accepts
    connections but cannot serve fails it; blackbox exporter's tcp prober, query_response)."""
    timeout = prom_duration(timeout_s)
    return {
        "modules": {
            BLACKBOX_MODULE: {"prober": "http", "timeout": timeout},
            REDIS_MODULE: {
                "prober": "tcp",
                "timeout": timeout,
                "tcp": {"query_response": [{"send": "PING"}, {"expect": "^\\+PONG"}]},
            },
        }
    }


def _probe_job(job: str, module: str, target: str, ports: dict[str, int]) -> dict[str, Any]:
    # The blackbox exporter's multi-target pattern (its README): the target becomes the `target`
    # parameter and `instance`, the address the exporter's.
    return {
        "job_name": job,
        "metrics_path": "/probe",
        "params": {"module": [module]},
        "static_configs": [{"targets": [target]}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "target_label": "__param_target"},
            {"source_labels": ["__param_target"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": f"127.0.0.1:{ports['blackbox']}"},
        ],
    }


def prometheus_config(
    plan: MonitoringPlan,
    ports: dict[str, int],
    s3_endpoint: str,
    run_id: str,
    metadata_engine: str | None = None,
    juicefs_client: str | None = None,
) -> dict[str, Any]:
    """`metadata_engine`: host:port of the JuiceFS metadata engine (Redis) to probe, if any;
    `juicefs_client`: host:port of the JuiceFS mount's metrics to scrape, if any."""
    scrape = prom_duration(plan.scrape_s)
    # A target that stops answering only reads 0 once its scrape times out, so the timeout is the
    # interval itself (Prometheus refuses a larger one).
    return {
        "global": {
            "scrape_interval": scrape,
            "scrape_timeout": scrape,
            "evaluation_interval": prom_duration(plan.evaluation_s),
            "external_labels": {"sandbox_run": run_id},
        },
        "rule_files": [str(plan.rule_file)],
        "scrape_configs": [
            # honor_labels: the module's own labels win over the scrape's (Red Hat Ceph Storage 4,
            # Dashboard guide, "Managing the Prometheus environment").
            {
                "job_name": CEPH_JOB,
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{ports['mgr-prometheus']}"]}],
            },
            _probe_job(OBJECT_STORE_JOB, BLACKBOX_MODULE, s3_endpoint, ports),
            *(
                [_probe_job(METADATA_ENGINE_JOB, REDIS_MODULE, metadata_engine, ports)]
                if metadata_engine
                else []
            ),
            *(
                [{"job_name": JUICEFS_CLIENT_JOB, "static_configs": [{"targets": [juicefs_client]}]}]
                if juicefs_client
                else []
            ),
        ],
    }


def dump(config: dict[str, Any], what: str) -> str:
    header = f"# Generated by gpufleet for the storage sandbox: {what}.\n"
    return header + yaml.safe_dump(config, sort_keys=False)


def blackbox_argv(config: Path, ports: dict[str, int]) -> list[str]:
    return [BLACKBOX_BIN, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{ports['blackbox']}"]


def prometheus_argv(config: Path, data: Path, ports: dict[str, int]) -> list[str]:
    return [
        PROMETHEUS_BIN,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
        "--log.level=warn",
    ]
