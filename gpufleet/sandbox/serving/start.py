"""Starting the sandbox's serving workload (stack `sandbox.serving`): one replica in each serving
node's namespace, listening on the node's management address, and HAProxy in the head namespace in
front of them. Both are recorded daemons with their launch recipes, so a node crash kills a replica
and its rollback starts it again like the node's other daemons."""

from __future__ import annotations

import shutil
import sys

from gpufleet.config.model import SandboxServing
from gpufleet.core.sandbox_contract import AGENT_HEALTH_FILE
from gpufleet.sandbox.layout import Layout
from gpufleet.sandbox.processes import Started, spawn
from gpufleet.sandbox.serving.balancer import Backend, BalancerConfig, haproxy_config


def admin_socket(layout: Layout) -> str:
    return str(layout.path("serving") / "haproxy.sock")


def balancer_config(layout: Layout, serving: SandboxServing) -> BalancerConfig:
    return BalancerConfig(
        bind_ip=layout.head.mgmt_ip, bind_port=serving.port, stats_port=serving.stats_port,
        replicas=tuple(Backend(n.name, n.mgmt_ip, serving.port) for n in layout.serving_nodes),
        health=serving.health, admin_socket=admin_socket(layout),
    )


def replica_argv(
    layout: Layout, node: str, serving: SandboxServing, python: str = sys.executable
) -> list[str]:
    n = layout.node(node)
    return [python, "-m", "gpufleet.sandbox.serving.replica", "--name", node,
            "--listen", f"{n.mgmt_ip}:{serving.port}",
            "--health-file", str(layout.node_dir(node) / AGENT_HEALTH_FILE)]


def start_replica(
    layout: Layout, node: str, serving: SandboxServing, python: str = sys.executable
) -> Started:
    layout.node_dir(node).mkdir(parents=True, exist_ok=True)
    return spawn(f"replica@{node}", replica_argv(layout, node, serving, python),
                 layout.node_dir(node) / "replica.log", netns=layout.node(node).netns, hostname=node)


def start_balancer(layout: Layout, serving: SandboxServing) -> Started:
    d = layout.path("serving")
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "haproxy.cfg"
    cfg.write_text(haproxy_config(balancer_config(layout, serving), str(d / "haproxy.pid")))
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    # -db: stay in the foreground (a recorded daemon is the process the sandbox started).
    return spawn("haproxy", [haproxy, "-db", "-f", str(cfg)], d / "haproxy.log", netns=layout.head.netns)


def urls(layout: Layout, serving: SandboxServing) -> tuple[str, str]:
    """The balancer's frontend and its stats CSV, reachable from the head namespace."""
    ip = layout.head.mgmt_ip
    return f"http://{ip}:{serving.port}", f"http://{ip}:{serving.stats_port}/stats;csv"
