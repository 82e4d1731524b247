"""Configuration files of a sandbox run, rendered as pure functions of its Layout.

Slurm files come from jinja2 templates (`templates/*.j2`); Prometheus' is built as data and dumped
as YAML so it is valid by construction.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpufleet.core.maintenance import UPGRADE_MARK
from gpufleet.sandbox.layout import AGENT_PORT, MGMT_IFNAME, SLURMCTLD_PORT, SLURMD_PORT, Layout

# What each sandbox node advertises to Slurm (SlurmdParameters=config_overrides lets a 2-core
# machine advertise more); jobs ask for GPUs and nodes, never for real memory.
CPUS_PER_NODE = 8
MEMORY_MB = 16384

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("gpufleet.sandbox", "templates"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def _context(layout: Layout, gpufleet_bin: Path) -> dict[str, Any]:
    return {
        "stack": layout.stack,
        "run_id": layout.run_id,
        "cluster_name": layout.cluster_name,
        "base_dir": str(layout.base_dir),
        "head": layout.head,
        "nodes": layout.nodes,
        "slurm_nodes": layout.slurm_nodes,
        "queue": layout.queue,
        "timings": layout.sandbox.slurm,
        "munge_socket": str(layout.munge_socket),
        "health_script": str(layout.health_script),
        "epilog_script": str(layout.epilog_script),
        "reboot_script": str(reboot_script_path(layout)),
        # `sandbox up` keeps each run under <state root>/<stack>/run-<id> (gpufleet.sandbox.up).
        "state_root": str(layout.base_dir.parent.parent),
        "slurm_conf": str(layout.slurm_conf),
        "token_file": str(layout.token_file),
        "bundle_ship": "" if layout.bundle_ship is None else str(layout.bundle_ship),
        "mgmt_ifname": MGMT_IFNAME,
        "xid_overrides": shlex.quote(layout.xid_overrides_json),
        "gpufleet": str(gpufleet_bin),
        "python": str(gpufleet_bin.parent / "python"),
        "slurmctld_port": SLURMCTLD_PORT,
        "slurmd_port": SLURMD_PORT,
        "cpus_per_node": CPUS_PER_NODE,
        "memory_mb": MEMORY_MB,
    }


def reboot_script_path(layout: Layout) -> Path:
    return layout.path("slurm", "reboot.sh")


def reboot_script(layout: Layout, gpufleet_bin: Path) -> str:
    """Slurm's RebootProgram: restarts the node's daemons in a new time namespace (ADR 0064)."""
    return render("reboot.sh.j2", layout, gpufleet_bin)


def render(template: str, layout: Layout, gpufleet_bin: Path) -> str:
    return _ENV.get_template(template).render(**_context(layout, gpufleet_bin))


def slurm_conf(layout: Layout, gpufleet_bin: Path) -> str:
    return render("slurm.conf.j2", layout, gpufleet_bin)


def cgroup_conf(layout: Layout) -> str:
    return render("cgroup.conf.j2", layout, Path("/nonexistent"))


def gres_conf(layout: Layout) -> str:
    return render("gres.conf.j2", layout, Path("/nonexistent"))


def health_script(layout: Layout, gpufleet_bin: Path, *, epilog: bool = False) -> str:
    """Slurm's HealthCheckProgram, or with `epilog` its Epilog: the same node check."""
    # The reasons a rollout sets: the Epilog stands aside for them in shell (held_by_rollout's test).
    return _ENV.get_template("healthcheck.sh.j2").render(**_context(layout, gpufleet_bin), epilog=epilog,
                                                         upgrade_mark=UPGRADE_MARK)


def prom_duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as `2s`, else milliseconds (`500ms`)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def prometheus_config(layout: Layout, rule_files: list[Path]) -> dict[str, Any]:
    """prometheus.yml: every node agent (dcgm-exporter's job shape) and the training job's own
    file_sd targets."""
    scrape = prom_duration(layout.scrape_interval_s)
    agents = [
        {
            "targets": [f"{n.mgmt_ip}:{AGENT_PORT}"],
            # `leaf`: the node's leaf group, which the catalog's FabricSwitchDown groups by (ADR 0040).
            "labels": {"node": n.name, "Hostname": n.name, "role": n.role,
                       **({"leaf": n.leaf} if n.leaf else {})},
        }
        for n in layout.nodes
    ]
    return {
        "global": {
            "scrape_interval": scrape,
            "scrape_timeout": scrape if layout.scrape_interval_s < 10 else "10s",
            "evaluation_interval": prom_duration(layout.evaluation_interval_s),
            "external_labels": {"cluster": layout.cluster_name, "sandbox_run": layout.run_id},
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "dcgm", "static_configs": agents},
            {
                "job_name": "training",
                "file_sd_configs": [
                    {"files": [str(layout.file_sd_dir / "*.json")], "refresh_interval": scrape}
                ],
            },
        ],
    }


def prometheus_yaml(layout: Layout, rule_files: list[Path]) -> str:
    header = f"# Generated by gpufleet for sandbox {layout.stack} (run {layout.run_id}).\n"
    return header + yaml.safe_dump(prometheus_config(layout, rule_files), sort_keys=False)


def hosts_json(layout: Layout) -> str:
    return json.dumps(layout.hosts_map(), indent=2, sort_keys=True) + "\n"
