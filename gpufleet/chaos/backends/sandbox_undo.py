"""Undoing sandbox faults: the rollbacks the fault ledger names (`sandbox.*` in
gpufleet.chaos.rollbacks) and the agent client they share with the backend.

Each rollback takes only its ledger arguments, so `gpufleet chaos revert` can run it after the runner
died, without the state file if need be.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from chaoslib.exceptions import ActivityFailed

from gpufleet.catalog.injection import DcgmInject
from gpufleet.chaos import sysops
from gpufleet.chaos.backends.base import nft_delete_argv
from gpufleet.core import mounts
from gpufleet.core.haproxy_runtime import set_server_state
from gpufleet.core.procs import launch, start_time
from gpufleet.core.sandbox_contract import Launch, read_state, write_state

logger = logging.getLogger("chaostoolkit")
AGENT_TIMEOUT_S = 5.0

# In-process stop switches of running flappers, so a rollback (or the control) stops them at once.
FLAPPERS: dict[str, threading.Event] = {}


# ----------------------------------------------------------------------------- agent


def dcgm_inject_body(gpu: int, inj: DcgmInject) -> dict[str, Any]:
    """The agent's POST /inject body for a DCGM injection (`dcgmi test --inject`), on the process
    sandbox's nodes and the Kubernetes sandbox's kubelet nodes alike."""
    return {"gpu": gpu, "field_id": inj.field_id, "value": inj.value, "kmsg": inj.kmsg, "burst": inj.burst}


def agent_request(
    socket: str, token_file: str | None, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """HTTP over the agent's unix socket, with its bearer token."""
    headers = {}
    if token_file:
        headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"
    transport = httpx.HTTPTransport(uds=socket)
    try:
        with httpx.Client(transport=transport, base_url="http://agent", timeout=AGENT_TIMEOUT_S) as c:
            r = c.request(method, path, json=body, headers=headers)
    except httpx.HTTPError as e:
        raise ActivityFailed(f"agent at {socket}: {method} {path} failed: {e}") from None
    if r.status_code >= 300:
        raise ActivityFailed(f"agent at {socket}: {method} {path} -> {r.status_code} {r.text[:300]}")
    return r.json() if r.content else None


def resume_node(slurm_prefix: list[str], node: str) -> None:
    """`scontrol update state=resume`: Slurm refuses it for a node that is not down/drained, which
    is fine (nothing to resume)."""
    if slurm_prefix:
        sysops.run([*slurm_prefix, "scontrol", "update", f"nodename={node}", "state=resume"], check=False)


# ----------------------------------------------------------------------------- rollbacks


def rb_agent_clear(args: dict[str, Any]) -> None:
    socket = args["socket"]
    if not os.path.exists(socket):
        logger.warning("agent socket %s is gone (sandbox down?): nothing to clear", socket)
        return
    agent_request(socket, args.get("token_file"), "POST", "/clear", {"gpu": args.get("gpu")})
    resume_node(list(args.get("slurm_prefix") or []), args["node"])


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def rb_link_up(args: dict[str, Any]) -> None:
    ev = FLAPPERS.pop(str(args.get("flap_id")), None)
    if ev is not None:
        ev.set()
    peer = args["peer"]
    if not link_exists(peer):
        logger.warning("link %s is gone (sandbox down?): nothing to bring up", peer)
        return
    sysops.run(["ip", "link", "set", peer, "up"])
    if args.get("node"):
        # The health check drained the node for the link; with the link back, return it to service
        # (the sandbox has no remediator to do it).
        resume_node(list(args.get("slurm_prefix") or []), args["node"])


def rb_host_restore(args: dict[str, Any]) -> None:
    """The node was repaired: restart its daemons if the fault crashed it, clear the agent's host
    signals (PSU, DIMM, disk replaced), resume it in Slurm."""
    if args.get("restart"):
        rb_restart_daemons(args["restart"])
    socket = args["socket"]
    if not os.path.exists(socket):
        logger.warning("agent socket %s is gone (sandbox down?): nothing to clear", socket)
        return
    # A restarted agent answers a moment after it starts; until then its socket file is the stale
    # one of the killed agent (connection refused).
    deadline = time.monotonic() + 15
    while True:
        try:
            agent_request(socket, args.get("token_file"), "POST", "/host/clear", {})
            break
        except ActivityFailed:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.3)
    resume_node(list(args.get("slurm_prefix") or []), args["node"])


def rb_links_up(args: dict[str, Any]) -> None:
    """A switch came back: every port behind it up, its nodes resumed."""
    for peer in args["peers"]:
        if link_exists(peer):
            sysops.run(["ip", "link", "set", peer, "up"])
    for node in args["nodes"]:
        resume_node(list(args.get("slurm_prefix") or []), node)


def rb_nic_restore(args: dict[str, Any]) -> None:
    """The NIC is back: its device takes its name again and comes up (addresses survive a rename)."""
    ns, hidden, ifname = args["netns"], args["hidden"], args["ifname"]
    if not netns_exists(ns):
        return
    present = sysops.run(["ip", "-n", ns, "-o", "link", "show"], check=False)
    if f" {hidden}:" in present or f" {hidden}@" in present:
        sysops.run(["ip", "-n", ns, "link", "set", hidden, "name", ifname])
    sysops.run(["ip", "-n", ns, "link", "set", ifname, "up"])
    resume_node(list(args.get("slurm_prefix") or []), args["node"])


def netns_exists(ns: str) -> bool:
    return Path(f"/run/netns/{ns}").exists()


def rb_link_restore(args: dict[str, Any]) -> None:
    ns, ifname = args["netns"], args["ifname"]
    if not netns_exists(ns):
        return
    table = args.get("nft_table")
    if table:
        sysops.run(["ip", "netns", "exec", ns, *nft_delete_argv(table)], check=False)
        left = sysops.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], check=False)
        if f"inet {table}" in left:
            raise ActivityFailed(f"nft table {table} still present in {ns}")
    if args.get("tc"):
        sysops.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", ifname, "root"], check=False)
        shown = sysops.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", ifname], check=False)
        if "tbf" in shown:
            raise ActivityFailed(f"tbf qdisc still on {ifname} in {ns}")


def rb_continue(args: dict[str, Any]) -> None:
    for pid, st in args["pids"]:
        sysops.signal_verified(int(pid), int(st), signal.SIGCONT)


def rb_reboot_hung(args: dict[str, Any]) -> None:
    """Reboot a hung node: SIGKILL its frozen processes (SIGKILL acts on stopped processes), wait for
    them to go, then start its daemons again and resume it in Slurm."""
    procs = [(int(p), int(st)) for p, st in args["pids"]]
    for pid, st in procs:
        sysops.signal_verified(pid, st, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(start_time(p) == st for p, st in procs):
        time.sleep(0.1)
    rb_restart_daemons(args["restart"])


def _running(netns: str, program: list[str]) -> bool:
    return any(sysops.cmdline(pid) == program for pid in sysops.netns_pids(netns))


def rb_restart_daemons(args: dict[str, Any]) -> None:
    """Start the node's daemons again from their recorded launch recipes (those not already
    running), then resume the node in Slurm."""
    netns = args["netns"]
    if not netns_exists(netns):
        logger.warning("namespace %s is gone (sandbox down?): nothing to restart", netns)
        return
    daemons = [(d["name"], Launch.model_validate(d["launch"])) for d in args["daemons"]]
    for name, recipe in daemons:
        if _running(netns, recipe.program):
            continue
        popen, st = launch(recipe)
        if st is None:
            raise ActivityFailed(f"restarting {name} failed at once ({popen.wait(5)}); see {recipe.log}")
        _update_state_pid(args.get("stack"), args.get("state_root"), name, popen.pid, st)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_running(netns, r.program) for _, r in daemons):
        time.sleep(0.2)
    resume_node(list(args.get("slurm_prefix") or []), args["node"])


def rb_replica_restore(args: dict[str, Any]) -> None:
    """A replica restart cut off: start the replica again if it is not running, and put it back in
    the balancer's rotation (its checks decide when it takes requests)."""
    rb_restart_daemons(args)
    sock = args.get("admin_socket")
    if sock and Path(sock).exists():
        set_server_state(sock, args["node"], "ready")


def _update_state_pid(stack: str | None, root: str | None, name: str, pid: int, st: int) -> None:
    """Keep the sandbox's state file naming the live process, so `sandbox down` stops the restarted
    daemon too (the contract's write_state is atomic)."""
    if not stack:
        return
    try:
        state = read_state(stack, Path(root) if root else None)
    except (OSError, ValueError):
        return
    procs = [
        p.model_copy(update={"pid": pid, "start_time": st}) if p.name == name else p for p in state.processes
    ]
    write_state(state.model_copy(update={"processes": procs}), Path(root) if root else None)


def mount_namespaces(netns_list: list[str]) -> dict[str, list[int]]:
    """The pids of the namespaces' processes, grouped by the mount namespace they are in."""
    out: dict[str, list[int]] = {}
    for ns in netns_list:
        if not netns_exists(ns):
            continue
        for pid in sysops.netns_pids(ns):
            try:
                key = os.readlink(f"/proc/{pid}/ns/mnt")
            except OSError:
                continue
            out.setdefault(key, []).append(pid)
    return out


def live_member(pids: list[int]) -> int | None:
    """A pid of the group that is still running (processes come and go: a rank restarts)."""
    return next((p for p in pids if Path(f"/proc/{p}/ns/mnt").exists()), None)


def run_in_mount_namespace(pids: list[int], argv: list[str]) -> bool:
    """Run argv in the mount namespace these pids share, entered through the first that is still
    alive: one may exit between the listing and nsenter. False when every one is gone (and with them
    the namespace); a failure of the command itself raises."""
    for pid in pids:
        try:
            sysops.run(in_ns(pid, argv))
            return True
        except ActivityFailed:
            if Path(f"/proc/{pid}/ns/mnt").exists():
                raise
    return False


def mounted(pid: int | None, path: str) -> int:
    """How many mounts are stacked at `path` in the mount namespace of `pid` (None: this process's)."""
    try:
        return len(mounts.mounts_at(path, mounts.read_mountinfo(pid)))
    except OSError:
        return 0


def in_ns(pid: int | None, argv: list[str]) -> list[str]:
    return argv if pid is None else ["nsenter", "-t", str(pid), "-m", "--", *argv]


def rb_storage_restore(args: dict[str, Any]) -> None:
    path = args["path"]
    groups = mount_namespaces(list(args["netns"])).values()
    targets: list[int | None] = [None, *(p for p in (live_member(g) for g in groups) if p is not None)]
    for pid in targets:
        base = mounted(pid, path) - int(args.get("base_mounts", {}).get("root" if pid is None else "ns", 0))
        for _ in range(max(0, base)):
            sysops.run(in_ns(pid, ["umount", path]), check=False)
    still = [
        pid
        for pid in targets
        if mounted(pid, path) > int(args.get("base_mounts", {}).get("root" if pid is None else "ns", 0))
    ]
    if still:
        raise ActivityFailed(f"{path} still has the fault mount in the mount namespaces of {still}")


