"""What a bundle holds for a sandbox node, read through the sandbox's public interface (its state
file and the endpoints it names: the node agent's socket, Prometheus on loopback, Slurm commands in
the head namespace, the daemons' Launch recipes and logs).

Prometheus is reached on the root namespace's loopback (its forwarder) and the node's links are read
with `ip -n <netns>`, so the collection works from any namespace: the node-health hook, which slurmd
starts inside the node's namespace, reads the metrics from a thread that first enters the network
namespace of a sandbox process that runs in the root namespace (docs/diagnostic-bundles.md).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from gpufleet.core import netns, procs
from gpufleet.core.agent_client import AgentError, agent_state
from gpufleet.core.sandbox_contract import AGENT_HEALTH_FILE, SandboxNode, SandboxProcess, SandboxState
from gpufleet.fleet.bundle.runner import Collector, Read, ReadError, read_tail

# Window of metrics around the detection time, seconds. Before: long enough to hold the node's state
# before the fault and the signal's rise (the catalog's slowest sandbox alert `for:` is under a
# minute); after: up to now when collected at detection, which is the point of collecting early.
WINDOW_BEFORE_S = 300.0
WINDOW_AFTER_S = 60.0
# At most this many points per series: a 6-minute window at the sandbox's scrape interval fits whole.
POINTS_PER_SERIES = 400


def window(detected_at: float, now: float, since: float | None = None) -> tuple[float, float]:
    """[start, end] of the metrics window: from `since` (else WINDOW_BEFORE_S before detection) to
    WINDOW_AFTER_S after detection, never past now."""
    start = since if since is not None else detected_at - WINDOW_BEFORE_S
    end = min(now, detected_at + WINDOW_AFTER_S)
    if start >= end:
        raise ValueError(f"empty window: start {start:.0f} is not before end {end:.0f}")
    return start, end


def metrics_expr(node: str) -> str:
    """Every series Prometheus has for the node: the agent's dcgm-exporter-shaped series carry
    `node` (the sandbox's scrape config), and so do its alerts."""
    return '{node="' + node.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def step_for(start: float, end: float) -> float:
    return max(1.0, (end - start) / POINTS_PER_SERIES)


def node_processes(state: SandboxState, node: str) -> list[SandboxProcess]:
    return [p for p in state.processes if p.node == node]


def agent_state_dir(state: SandboxState, node: SandboxNode) -> Path | None:
    """The agent's --state-dir, from its Launch recipe (where gpu-health.json is written)."""
    for p in node_processes(state, node.name):
        argv = p.launch.program
        if "--state-dir" in argv[:-1] and "gpufleet.sandbox.agent" in argv:
            return Path(argv[argv.index("--state-dir") + 1])
    return None


def _json(doc: object) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _agent_read(socket: Path, token_file: Path) -> Read:
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        try:
            token = token_file.read_text().strip()
            return _json(agent_state(socket, token, timeout=timeout)), False
        except (OSError, AgentError) as e:
            raise ReadError(str(e)) from None
    return read


def _file_read(path: Path) -> Read:
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        return read_tail(path, cap)
    return read


def root_netns(state: SandboxState) -> Path | None:
    """The root network namespace, as /proc/<pid>/ns/net of a live sandbox process started there."""
    for p in state.processes:
        if p.netns is None and procs.alive(p.pid, p.start_time):
            return Path(f"/proc/{p.pid}/ns/net")
    return None


def query_range(url: str, expr: str, start: float, end: float, step: float, timeout: float) -> object:
    """Prometheus's /api/v1/query_range with urllib, not core.promapi's httpx client: the node-health
    hook pays every import before the drain, and httpx (with what it pulls in) was half of the hook's
    start-up (measured with -X importtime)."""
    query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                    "step": f"{step:g}"})
    where = f"Prometheus {url}/api/v1/query_range"
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{query}", timeout=timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            raise ReadError(f"{where}: HTTP {e.code}: {e.read()[:200].decode(errors='replace')}") from None
    except (OSError, ValueError) as e:
        raise ReadError(f"{where}: {e}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ReadError(f"{where}: {body.get('error', body) if isinstance(body, dict) else body}")
    return body["data"].get("result", [])


def metrics_read(url: str, node: str, start: float, end: float, netns_path: Path | None) -> Read:
    def read(cap: int, timeout: float) -> tuple[bytes, bool]:
        step = step_for(start, end)
        try:
            # Each collector has its own thread, and setns(2) moves only the calling one.
            if netns_path is not None and os.stat(netns_path).st_ino != netns.current_netns_inode():
                netns.enter(netns_path)
        except OSError as e:
            raise ReadError(f"cannot enter the root network namespace ({netns_path}): {e}") from None
        result = query_range(url, metrics_expr(node), start, end, step, timeout)
        doc = {"query": metrics_expr(node), "start": start, "end": end, "step": step, "result": result}
        return _json(doc), False
    return read


def collectors(state: SandboxState, node_name: str, start: float, end: float) -> list[Collector]:
    """The sandbox node's collectors, most asked-for first (the total cap drops from the end)."""
    node = state.node(node_name)
    out: list[Collector] = []
    if node.agent_socket and state.agent_token_file:
        out.append(Collector("agent-state", "agent/state.json", ["GET", "/state", node.agent_socket],
                             read=_agent_read(Path(node.agent_socket), Path(state.agent_token_file))))
    state_dir = agent_state_dir(state, node)
    if state_dir is not None:
        health = state_dir / AGENT_HEALTH_FILE
        out.append(Collector("gpu-health", f"agent/{AGENT_HEALTH_FILE}", ["file", str(health)],
                             read=_file_read(health)))
    if node.kernel_log:
        out.append(Collector("kernel-log", "kernel/kern.log", ["file", node.kernel_log],
                             read=_file_read(Path(node.kernel_log))))
    if state.head_netns and state.slurm_conf:
        out.append(Collector("slurm-node", "slurm/scontrol-show-node.txt",
                             state.slurm_command("scontrol", "show", "node", node.name)))
    out.append(Collector("fabric-links", "fabric/ip-link.txt",
                         ["ip", "-n", node.netns, "-s", "-d", "link", "show"]))
    if state.prometheus_url:
        what = ["GET", "/api/v1/query_range", metrics_expr(node.name), f"{start:.0f}", f"{end:.0f}"]
        out.append(Collector("metrics", "metrics/query_range.json", what,
                             read=metrics_read(state.prometheus_url, node.name, start, end,
                                                 root_netns(state))))
    for p in node_processes(state, node.name):
        out.append(Collector(f"log:{p.name}", f"logs/{_safe(p.name)}.log", ["file", p.launch.log],
                             read=_file_read(Path(p.launch.log))))
    epilog = state_dir / "epilog.log" if state_dir is not None else None
    if epilog is not None and epilog.exists():  # written once a job has ended on the node
        out.append(Collector("log:epilog", "logs/epilog.log", ["file", str(epilog)], read=_file_read(epilog)))
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)


