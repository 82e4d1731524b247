"""`python -m gpufleet.sandbox.agent`: the fake-GPU node agent of one sandbox node.

Started by `gpufleet sandbox up` inside the node's network namespace (`ip netns exec`, so that
/sys/class/net shows the node's own links). See docs/node-agent.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry, start_http_server

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.catalog.policy import parse_overrides
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.sandbox.agent.control import serve_control
from gpufleet.sandbox.agent.exposition import AgentCollector
from gpufleet.sandbox.agent.fields import MODEL_NAMES
from gpufleet.sandbox.agent.runtime import Agent, Versions
from gpufleet.sandbox.agent.vendors import vendor_format

log = logging.getLogger("gpufleet.sandbox.agent")


def parse_listen(text: str) -> tuple[str, int]:
    """`IP:PORT` (IPv4) -> (ip, port); raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"--listen must be IP:PORT, got {text!r}")
    ipaddress.IPv4Address(host)
    p = int(port)
    if not 0 <= p <= 65535:  # 0: any free port (tests)
        raise ValueError(f"port {p} out of range")
    return host, p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.agent", description=__doc__)
    p.add_argument("--node", required=True, help="node name (Hostname label, kernel-log host)")
    p.add_argument("--gpus", type=int, default=8, help="number of fake GPUs")
    p.add_argument("--model", default=AcceleratorModel.H100_SXM.value,
                   choices=[m.value for m in AcceleratorModel],
                   help="accelerator model (stack name): NVIDIA's publish dcgm-exporter's format, AMD's "
                        "device-metrics-exporter's, Ascend's npu-exporter's")
    p.add_argument("--listen", required=True, help="IP:PORT of /metrics (management network)")
    p.add_argument("--control-socket", required=True, type=Path, help="unix socket of the control API")
    p.add_argument("--token-file", required=True, type=Path, help="file holding the bearer token")
    p.add_argument("--state-dir", required=True, type=Path, help="injected state, gpu-health.json")
    p.add_argument("--kernel-log", required=True, type=Path, help="the node's kern.log (NVRM: Xid lines)")
    p.add_argument("--fabric-ifnames", default="", help="comma-separated fabric interfaces (fab0,fab1)")
    p.add_argument("--link-speed-gbps", type=float, default=None,
                   help="fabric link speed (Gb/s): publish node_infiniband_rate_bytes_per_second, lowered "
                        "to the kernel's tbf rate limit on a link when one is set")
    p.add_argument("--xid-overrides", default="{}",
                   help='the stack\'s remediation.xidOverrides as JSON: {"<xid>": {"action", "reason", '
                        '"faultClass"}}')
    p.add_argument("--driver-version", default=None,
                   help="the driver version this node runs (GET /state driver_version); a rolling "
                        "upgrade restarts the agent with another")
    p.add_argument("--firmware-version", default=None, help="the GPU firmware (VBIOS) version it runs")
    p.add_argument("--bad-versions", default="",
                   help="comma-separated versions the fake GPUs fail to load under: running one, the "
                        "agent reports a driver_error in GET /state (a rolling upgrade's gate fails)")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        host, port = parse_listen(args.listen)
        if not 1 <= args.gpus <= 16:
            raise ValueError("--gpus must be 1..16")
        token = args.token_file.read_text().strip()
        if not token:
            raise ValueError(f"token file {args.token_file} is empty")
        catalog = load_catalog()
        rules, problems = xid_policy(catalog, parse_overrides(args.xid_overrides, "--xid-overrides"))
        if problems:
            raise ValueError("--xid-overrides: " + "; ".join(f"{p.path}: {p.message}" for p in problems))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ifnames = [n.strip() for n in args.fabric_ifnames.split(",") if n.strip()]
    model = AcceleratorModel(args.model)
    vendor = vendor_format(model)
    agent = Agent(
        node=args.node, gpus=args.gpus,
        model_name=vendor.model_label if vendor is not None else MODEL_NAMES[model], vendor=vendor,
        state_dir=args.state_dir, kernel_log=args.kernel_log, fabric_ifnames=ifnames,
        catalog=catalog, xid_rules=rules, link_speed_gbps=args.link_speed_gbps,
        versions=Versions(args.driver_version, args.firmware_version,
                          frozenset(v.strip() for v in args.bad_versions.split(",") if v.strip())),
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent.snapshot))
    metrics_server, _ = start_http_server(port, addr=host, registry=registry)
    control = serve_control(args.control_socket, agent, token)
    threading.Thread(target=control.serve_forever, name="control", daemon=True).start()
    log.info("agent %s: %d GPUs, metrics on http://%s:%d/metrics, control on %s, fabric %s",
             args.node, args.gpus, host, port, args.control_socket, ifnames)

    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop.wait()
    control.shutdown()
    control.server_close()
    metrics_server.shutdown()
    args.control_socket.unlink(missing_ok=True)
    return 0
