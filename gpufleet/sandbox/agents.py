"""Starting the node agents (gpufleet.sandbox.agent, one per node namespace) and talking to their
control sockets (HTTP over a unix socket, bearer token)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

import httpx

from gpufleet.core.durable_files import write_private
from gpufleet.sandbox import boot
from gpufleet.sandbox.layout import AGENT_PORT, Layout
from gpufleet.sandbox.processes import Started, spawn


def write_token(path: Path) -> str:
    token = secrets.token_hex(32)
    write_private(path, token + "\n")
    return token


def agent_argv(layout: Layout, node: str, python: str = sys.executable) -> list[str]:
    n = layout.node(node)
    d = layout.node_dir(node)
    return [
        python,
        "-m",
        "gpufleet.sandbox.agent",
        "--node",
        node,
        "--gpus",
        str(n.gpus),
        "--model",
        n.accelerator,
        "--listen",
        f"{n.mgmt_ip}:{AGENT_PORT}",
        "--control-socket",
        str(layout.agent_socket(node)),
        "--token-file",
        str(layout.token_file),
        "--state-dir",
        str(d),
        "--kernel-log",
        str(layout.kernel_log(node)),
        "--fabric-ifnames",
        ",".join(ifname for _, ifname, _, _ in n.fabric),
        "--link-speed-gbps",
        f"{layout.link_speed_gbps:g}",
        "--xid-overrides",
        layout.xid_overrides_json,
        *version_options(n.driver_version, n.firmware_version, layout.sandbox.bad_versions),
    ]


def version_options(driver: str | None, firmware: str | None, bad: list[str]) -> list[str]:
    """The agent's version options: what it reports it runs, and the versions its fake GPUs fail
    under (a rolling upgrade rewrites --driver-version / --firmware-version in the recipe)."""
    out: list[str] = []
    if driver is not None:
        out += ["--driver-version", driver]
    if firmware is not None:
        out += ["--firmware-version", firmware]
    if bad:
        out += ["--bad-versions", ",".join(bad)]
    return out


def start_agent(layout: Layout, node: str) -> Started:
    layout.node_dir(node).mkdir(parents=True, exist_ok=True)
    return spawn(
        f"agent@{node}",
        # In its node's time namespace, as slurmd is (gpufleet.sandbox.boot).
        boot.booted(agent_argv(layout, node), boot.node_boot_offset(layout.node(node).netns)),
        layout.node_dir(node) / "agent.log",
        netns=layout.node(node).netns,
        hostname=node,
    )


class AgentClient:
    def __init__(self, socket_path: str | Path, token: str, timeout: float = 5.0) -> None:
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path)),
            base_url="http://agent",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def inject(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self._http.post("/inject", json=body)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def clear(self) -> None:
        """Clear every GPU's faults (a GPU reset / node reboot)."""
        self._http.post("/clear", json={"gpu": None}).raise_for_status()
