"""The sandbox's networks: namespaces, bridges and veth links, made and removed with iproute2.

Safety (sandbox-notes.md): the bridges get NO address in the root namespace, no namespace gets a
default route, IPv6 is disabled on every link the run makes, so no packet can leave the bridges and
nothing in the root namespace routes to the sandbox's subnets.

Commands are planned as pure lists (`plan_*`) and run through `ip -batch` (one process per
namespace) to keep bring-up fast.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from gpufleet.core import netns
from gpufleet.sandbox.layout import MGMT_IFNAME, Layout, NodePlan, mgmt_bridge


class NetworkError(RuntimeError):
    pass


def plan_bridges(layout: Layout) -> list[str]:
    # STP off and no forwarding delay: ports forward at once (ip-link(8), bridge options).
    return [f"link add {b} type bridge stp_state 0 forward_delay 0" for b in layout.bridges]


def plan_links(layout: Layout) -> list[str]:
    """veth pairs created with their inner end directly inside the node's namespace."""
    cmds: list[str] = []
    mbr = mgmt_bridge(layout.run_id)
    for n in (layout.head, *layout.nodes):
        cmds.append(f"link add {n.mgmt_peer} type veth peer name {MGMT_IFNAME} netns {n.netns}")
        cmds.append(f"link set {n.mgmt_peer} master {mbr}")
        for rail, ifname, peer, _ in n.fabric:
            cmds.append(f"link add {peer} type veth peer name {ifname} netns {n.netns}")
            cmds.append(f"link set {peer} master {layout.bridges[1 + rail]}")
    return cmds


def plan_up(names: Iterable[str]) -> list[str]:
    return [f"link set {name} up" for name in names]


def plan_inside(node: NodePlan) -> list[str]:
    """Addresses inside one namespace: loopback, management, one per fabric rail. No routes
    beyond the connected /24s."""
    cmds = ["link set lo up", f"addr add {node.mgmt_cidr} dev {MGMT_IFNAME}", f"link set {MGMT_IFNAME} up"]
    for _, ifname, _, ip in node.fabric:
        cmds += [f"addr add {ip}/24 dev {ifname}", f"link set {ifname} up"]
    return cmds


def ip_batch(cmds: list[str], namespace: str | None = None, force: bool = False) -> None:
    if not cmds:
        return
    argv = ["ip"] + (["-n", namespace] if namespace else []) + (["-force"] if force else []) + ["-batch", "-"]
    res = subprocess.run(argv, input="\n".join(cmds) + "\n", capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        where = f" in {namespace}" if namespace else ""
        raise NetworkError(f"ip -batch failed{where}: {res.stderr.strip()}")


def _disable_ipv6_here(names: Iterable[str] = ("all", "default")) -> None:
    for name in names:
        Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")


def disable_ipv6_root(links: Iterable[str]) -> None:
    """Per link in the root namespace (never touch the host's all/default)."""
    for name in links:
        p = Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6")
        if p.exists():  # absent when the kernel has no IPv6 at all
            p.write_text("1")


def disable_ipv6_in(namespace: str) -> None:
    if Path("/proc/sys/net/ipv6").exists():
        netns.run_in(namespace, _disable_ipv6_here)


def existing_netns() -> set[str]:
    d = netns.NETNS_RUN_DIR
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def existing_links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}


def create(layout: Layout, record: Callable[[str, list[str]], None]) -> None:
    """Make the run's namespaces, bridges and links. `record(kind, names)` is called BEFORE each
    group is created so a crash leaves a state file naming everything that may exist."""
    clash = set(layout.namespaces) & existing_netns()
    clash |= (set(layout.bridges) | set(layout.root_links)) & existing_links()
    if clash:
        raise NetworkError(f"names of run {layout.run_id} already exist: {sorted(clash)}")
    record("namespaces", layout.namespaces)
    ip_batch([f"netns add {ns}" for ns in layout.namespaces])
    for ns in layout.namespaces:
        # Before the veths arrive: inner ends then inherit `default` (IPv6 off).
        disable_ipv6_in(ns)
    record("bridges", layout.bridges)
    record("links", layout.root_links)
    ip_batch(plan_bridges(layout) + plan_links(layout))
    disable_ipv6_root(layout.bridges + layout.root_links)
    ip_batch(plan_up(layout.bridges + layout.root_links))
    for node in (layout.head, *layout.nodes):
        ip_batch(plan_inside(node), namespace=node.netns)


def netns_pids(namespace: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return []
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def remove(namespaces: Iterable[str], bridges: Iterable[str], links: Iterable[str]) -> list[str]:
    """Delete what exists of the given names; returns what could not be removed."""
    have_links = existing_links()
    link_cmds = [f"link del {n}" for n in links if n in have_links]
    link_cmds += [f"link del {b}" for b in bridges if b in have_links]
    have_ns = existing_netns()
    ns_cmds = [f"netns del {ns}" for ns in namespaces if ns in have_ns]
    failed: list[str] = []
    for cmds in (link_cmds, ns_cmds):
        try:
            ip_batch(cmds, force=True)  # -force: keep going past one failure
        except NetworkError as e:
            failed.append(str(e))
    left = (set(namespaces) & existing_netns()) | ((set(links) | set(bridges)) & existing_links())
    return failed if left else []
