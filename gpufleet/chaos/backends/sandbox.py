"""The sandbox backend: faults on the local sandbox, through its public state file only
(gpufleet.core.sandbox_contract): agent control sockets, root-side veth peers, `ip netns pids`,
Slurm commands in the head namespace, Prometheus on loopback.

Rollback functions here take only their ledger arguments, so `gpufleet chaos revert` can run them
after the runner died, without the state file if need be.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog.injection import (
    DcgmInject,
    ExporterInject,
    GpuHang,
    HostSignal,
    InjectionModel,
    KillRank,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    NicRemove,
    NodeCrash,
    NodeHang,
    NodeReboot,
    SlurmStateLoss,
    StorageOutage,
    StorageSlow,
    SwitchDown,
)
from gpufleet.chaos import sysops
from gpufleet.chaos.backends import slurm_state_fault
from gpufleet.chaos.backends.base import (
    Backend,
    NodeInfo,
    Plan,
    ServingTarget,
    nft_loss_argv,
    nft_table,
    tbf_argv,
)
from gpufleet.chaos.backends.sandbox_undo import (
    FLAPPERS,
    agent_request,
    dcgm_inject_body,
    link_exists,
    mount_namespaces,
    mounted,
    netns_exists,
    rb_restart_daemons,
    resume_node,
    run_in_mount_namespace,
)
from gpufleet.chaos.ledger import Ledger, Rollback
from gpufleet.core.haproxy_runtime import set_server_state
from gpufleet.core.haproxy_stats import in_rotation, replica_states, server_sessions, server_states
from gpufleet.core.netns import run_in
from gpufleet.core.procs import alive, start_time
from gpufleet.core.sandbox_contract import (
    ControllerStatus,
    SandboxNode,
    SandboxState,
    read_controller_status,
    read_state,
    state_path,
)
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo

logger = logging.getLogger("chaostoolkit")


# ----------------------------------------------------------------------------- the backend


def _listen_of(program: list[str]) -> str:
    """The replica's IP:PORT from its recorded command line (`--listen IP:PORT`)."""
    try:
        return program[program.index("--listen") + 1]
    except (ValueError, IndexError):
        raise ActivityFailed(f"the replica's recorded command line has no --listen: {program}") from None


def _http_ok(url: str, netns: str | None) -> bool:
    """GET `url` (from inside `netns`) answered 200."""
    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return int(r.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    return get() if netns is None else run_in(netns, get)


class SandboxBackend(Backend):
    name = "sandbox"
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset({
        DcgmInject, ExporterInject, GpuHang, NodeCrash, NodeHang, NodeReboot, LinkDown, LinkFlap, LinkDegrade,
        StorageOutage, KillRank, HostSignal, SwitchDown, NicRemove, SlurmStateLoss,
    })
    not_offered: ClassVar[Mapping[type[InjectionModel], str]] = {
        StorageSlow: "the sandbox's checkpoint store is a local directory; slowing it needs a "
        "block-device throttle (dm-delay / io.max on its own device) that this machine does not provide",
    }

    def __init__(self, stack: str, state_root: Path | None = None) -> None:
        self.stack = stack
        self.state_root = state_root
        path = state_path(stack, state_root)
        try:
            self.state: SandboxState = read_state(stack, state_root)
        except FileNotFoundError:
            raise ActivityFailed(
                f"no sandbox state at {path}: bring it up with `gpufleet sandbox up --stack {stack}`"
            ) from None
        if self.state.phase != "up":
            raise ActivityFailed(f"sandbox {stack} is {self.state.phase}, not up ({path})")

    # ------------------------------------------------------------ observations
    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(n.name, n.role) for n in self.state.nodes if n.role != "head"]

    def node_states(self) -> dict[str, NodeObs]:
        """Slurm's view of its nodes, and the balancer's of the serving replicas' nodes: a replica
        out of the rotation is the serving pool's drained node (its isolation in the timeline)."""
        out = parse_sinfo(sysops.run(self.state.slurm_command(*SINFO_ARGS)))
        target = self.serving()
        if target is not None and target.stats_url is not None:
            out.update(replica_states(server_states(target.stats_url, target.netns), target.replicas))
        return out

    def prometheus_url(self) -> str | None:
        return self.state.prometheus_url

    def workload_events(self) -> str | None:
        return self.state.training_events

    def job_nodes(self) -> list[str]:
        name = self.state.training_job_name
        if not name:
            return []
        packed = sysops.run(
            self.state.slurm_command("squeue", "-h", "-n", name, "-t", "R", "-o", "%N")
        ).split()
        out: list[str] = []
        for p in packed:
            out += sysops.run(self.state.slurm_command("scontrol", "show", "hostnames", p)).split()
        return out

    def dead_daemons(self) -> list[str]:
        return [p.name for p in self.state.processes if not alive(p.pid, p.start_time)]

    def _controller(self) -> ControllerStatus | None:
        if not self.state.training_controller:
            return None
        try:
            return read_controller_status(Path(self.state.training_controller))
        except (OSError, ValueError):
            return None

    def training_incarnation(self) -> int | None:
        st = self._controller()
        return None if st is None or st.job_id is None else st.incarnation

    def training_note(self) -> str:
        st = self._controller()
        if st is None:
            return ""
        if st.gave_up:
            return f"auto-resume gave up: {st.gave_up}"
        return f"auto-resume: incarnation {st.incarnation}, job {st.job_id} {st.job_state or ''}".strip()

    def restart_dead_daemons(self) -> list[str]:
        """Restart every node's dead daemons from the state file's argv. A dead head daemon
        (slurmctld, Prometheus, munged, the controller) is not restarted here: the sandbox must be
        rebuilt (`gpufleet sandbox down` + `up`)."""
        dead = {p.name: p for p in self.state.processes if not alive(p.pid, p.start_time)}
        node_names = {n.name for n in self.state.nodes if n.role != "head"}
        on_nodes = sorted({p.node for p in dead.values() if p.node in node_names}, key=str)
        head = [name for name, p in dead.items() if p.node not in node_names]
        if head:
            raise ActivityFailed(f"head daemon(s) {', '.join(sorted(head))} not running: rebuild the sandbox")
        for node in on_nodes:
            rb_restart_daemons(self._restart_rb(self._node(str(node))).args)
        return [f"restarted daemons of {node}" for node in on_nodes]

    def serving(self) -> ServingTarget | None:
        st = self.state
        if st.serving_url is None:
            return None
        return ServingTarget(st.serving_url, st.serving_stats_url, st.head_netns,
                             tuple(n.name for n in st.nodes if n.role == "serving"))

    def resume_node(self, node: str) -> None:
        resume_node(self._slurm_prefix_of(node), node)

    def _slurm_prefix_of(self, node: str) -> list[str]:
        """Slurm's commands for a node Slurm knows; none for a serving node (outside Slurm)."""
        return [] if self._node(node).role == "serving" else self._slurm_prefix()

    def resume_training(self) -> str:
        """Ask the auto-resume controller for a job: SIGHUP resets its restart budget, and it submits
        the next incarnation when no job is running."""
        self.reset_restart_budget()
        return "asked the auto-resume controller to resubmit training (restart budget reset)"

    def reset_restart_budget(self) -> None:
        ctl = next((p for p in self.state.processes if p.name == "autoresume"), None)
        if ctl is None:
            raise ActivityFailed("this sandbox has no auto-resume controller: rebuild it")
        sysops.signal_verified(ctl.pid, ctl.start_time, signal.SIGHUP)

    def _node(self, name: str) -> SandboxNode:
        try:
            n = self.state.node(name)
        except KeyError as e:
            raise InvalidActivity(str(e.args[0])) from None
        if n.role == "head":
            raise InvalidActivity(f"{name} is the head node; faults go to compute or spare nodes")
        return n

    def _slurm_prefix(self) -> list[str]:
        try:
            return self.state.slurm_command()
        except RuntimeError:
            return []

    # ------------------------------------------------------------ GPU
    def plan_dcgm_inject(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        return self._agent_inject("dcgm-inject", node, gpu, dcgm_inject_body(gpu, inj),
                                  f"DCGM field {inj.field_id}={inj.value}")

    def plan_exporter_inject(self, node: str, gpu: int, inj: ExporterInject) -> Plan:
        """The node agent speaks the stack's vendor's exporter format (docs/node-agent.md) and
        refuses a series that format lacks."""
        body = {"gpu": gpu, "metric": inj.metric, "value": inj.value}
        return self._agent_inject("exporter-inject", node, gpu, body, f"{inj.metric}={inj.value}")

    def plan_gpu_hang(self, node: str, gpu: int, inj: GpuHang) -> Plan:
        """The agent marks the GPU hung: the processes on it (training ranks, a serving replica's
        engine) block at their next pass, and its exporter shows nothing but 100 % utilization."""
        return self._agent_inject("gpu-hang", node, gpu, {"gpu": gpu}, "a GPU hang", path="/hang")

    def _agent_inject(
        self, method: str, node: str, gpu: int, body: dict[str, Any], what: str, path: str = "/inject"
    ) -> Plan:
        """POST `path` to the node's agent; undone by clearing the GPU (a GPU reset)."""
        n = self._node(node)
        if n.agent_socket is None:
            raise ActivityFailed(f"node {node} has no agent socket in the sandbox state")
        if not 0 <= gpu < max(n.gpus, 1):
            raise InvalidActivity(f"node {node} has GPUs 0..{n.gpus - 1}, not {gpu}")
        sock, token = n.agent_socket, self.state.agent_token_file
        rb = Rollback(
            "sandbox.agent-clear",
            {
                "socket": sock,
                "token_file": token,
                "gpu": gpu,
                "node": node,
                "slurm_prefix": self._slurm_prefix_of(node),
            },
        )

        def apply() -> dict[str, Any]:
            return {"agent": agent_request(sock, token, "POST", path, body) or {}}

        return Plan(method, {"node": node, "gpu": gpu}, body, rb, apply,
                    f"inject {what} on {node} GPU {gpu} via {sock}")

    # ------------------------------------------------------------ node
    def _daemons(self, n: SandboxNode) -> list[dict[str, Any]]:
        """The node's daemons and the launch recipe the sandbox started each with (its contract)."""
        return [
            {"name": p.name, "launch": p.launch.model_dump()}
            for p in self.state.processes
            if p.node == n.name or (p.node is None and p.netns == n.netns)
        ]

    def _node_procs(self, n: SandboxNode) -> list[tuple[int, int]]:
        return sysops.snapshot(sysops.netns_pids(n.netns))

    def _restart_rb(self, n: SandboxNode) -> Rollback:
        return Rollback(
            "sandbox.restart-daemons",
            {
                "node": n.name,
                "netns": n.netns,
                "daemons": self._daemons(n),
                "slurm_prefix": self._slurm_prefix_of(n.name),
                "stack": self.stack,
                "state_root": str(self.state_root) if self.state_root else None,
            },
        )

    def plan_replica_restart(self, replica: str, drain_timeout_s: float, ready_timeout_s: float) -> Plan:
        st = self.state
        n = self._node(replica)
        proc = next((p for p in st.processes if p.name == f"replica@{replica}"), None)
        if n.role != "serving" or proc is None:
            raise InvalidActivity(f"{replica} runs no serving replica of this sandbox")
        if st.serving_admin_socket is None or st.serving_stats_url is None:
            raise ActivityFailed("this sandbox's balancer has no admin socket: rebuild it (sandbox up)")
        sock, stats, head = st.serving_admin_socket, st.serving_stats_url, st.head_netns
        ready_url = f"http://{_listen_of(proc.launch.program)}/ready"
        rb = Rollback("sandbox.replica-restore", {
            "node": replica, "netns": n.netns, "admin_socket": sock, "slurm_prefix": [],
            "daemons": [{"name": proc.name, "launch": proc.launch.model_dump()}],
            "stack": self.stack, "state_root": str(self.state_root) if self.state_root else None,
        })

        def wait(what: str, timeout_s: float, done: Callable[[], bool]) -> float:
            t0 = time.monotonic()
            while not done():
                if time.monotonic() - t0 > timeout_s:
                    raise ActivityFailed(f"restarting replica {replica}: {what} not within {timeout_s:g} s")
                time.sleep(0.1)
            return round(time.monotonic() - t0, 3)

        def apply() -> dict[str, Any]:
            out: dict[str, Any] = {}
            set_server_state(sock, replica, "drain")
            out["drained_s"] = wait("its requests finished", drain_timeout_s,
                                    lambda: server_sessions(stats, head).get(replica, -1) == 0)
            now = self.state.processes  # the state file names the live process (a rollback may restart it)
            live = next((p for p in now if p.name == proc.name), proc)
            sysops.signal_verified(live.pid, live.start_time, signal.SIGTERM)
            out["stopped_s"] = wait("the process exited", 10.0, lambda: not alive(live.pid, live.start_time))
            rb_restart_daemons(rb.args)  # starts it from its recipe and records the new pid
            out["ready_s"] = wait("readiness", ready_timeout_s, lambda: _http_ok(ready_url, head))
            set_server_state(sock, replica, "ready")
            out["in_rotation_s"] = wait("back in the rotation", ready_timeout_s,
                                        lambda: in_rotation(server_states(stats, head).get(replica, "")))
            return out

        def done(rec_id: str, ledger: Ledger) -> None:
            ledger.mark_reverted(rec_id, ok=True)  # the operation completed: nothing is left to undo

        return Plan(self.REPLICA_RESTART, {"node": replica}, {"drain_timeout_s": drain_timeout_s,
                                                           "ready_timeout_s": ready_timeout_s},
                    rb, apply, f"restart replica {replica} (drain, stop, start, ready)", {replica}, done)

    def plan_node_crash(self, node: str) -> Plan:
        n = self._node(node)
        rb = self._restart_rb(n)

        def apply() -> dict[str, Any]:
            procs = self._node_procs(n)
            return {"killed": sysops.kill_all(procs), "pids": [p for p, _ in procs]}

        return Plan(
            "node-crash",
            {"node": node},
            {},
            rb,
            apply,
            f"SIGKILL every process in {n.netns} (slurmd, agent, ranks)",
            {node},
        )

    def plan_host_signal(self, node: str, inj: HostSignal) -> Plan:
        """Set (or add to) a host signal on the node's agent (BMC sensor, EDAC count, read-only disk,
        port error counter). effect "sigbus": the agent SIGBUSes the node's training ranks (a UE in
        their memory); effect "crash": the node then loses every process (an IERR resets it)."""
        signal, value, add, effect = inj.signal, inj.value, inj.add, inj.effect
        n = self._node(node)
        if n.agent_socket is None:
            raise ActivityFailed(f"node {node} has no agent socket in the sandbox state")
        body: dict[str, Any] = {"signal": signal, "kill_processes": effect == "sigbus"}
        body.update({"value": value} if value is not None else {"add": add})
        sock, token = n.agent_socket, self.state.agent_token_file
        restart = self._restart_rb(n).args if effect == "crash" else None

        def apply() -> dict[str, Any]:
            out: dict[str, Any] = {"agent": agent_request(sock, token, "POST", "/host", body)}
            if effect == "crash":
                procs = self._node_procs(n)
                out["killed"] = sysops.kill_all(procs)
            return out

        return Plan(
            "host-signal",
            {"node": node, "signal": signal},
            {k: v for k, v in (("value", value), ("add", add), ("effect", effect)) if v is not None},
            Rollback("sandbox.host-restore", {"socket": sock, "token_file": token, "node": node,
                                              "slurm_prefix": self._slurm_prefix_of(node),
                                              "restart": restart}),
            apply,
            f"{signal} {'=' if value is not None else '+='} {value if value is not None else add} on {node}"
            + (f", then {effect}" if effect else ""),
            {node} if effect == "crash" else set(),
        )

    def plan_node_hang(self, node: str, inj: NodeHang) -> Plan:
        reboot_on_restore = inj.reboot_on_restore
        n = self._node(node)
        procs = self._node_procs(n)
        rb = Rollback("sandbox.continue", {"pids": procs})
        if reboot_on_restore:
            # What the catalog's remediation for a hung node does (action reboot-node): the frozen
            # processes never run again. Thawing them instead lets the stale copy of a requeued job
            # (its srun) act on the new incarnation (sandbox-notes.md item 11; Slurm step ids restart
            # at 0 on requeue) - measured here: it killed the resumed job once more.
            rb = Rollback("sandbox.reboot-hung", {"pids": procs, "restart": self._restart_rb(n).args})

        def apply() -> dict[str, Any]:
            stopped = sum(sysops.signal_verified(p, st, signal.SIGSTOP) for p, st in procs)
            return {"stopped": stopped}

        return Plan(
            "node-hang",
            {"node": node},
            {},
            rb,
            apply,
            f"SIGSTOP the {len(procs)} processes in {n.netns}",
            {node},
        )

    def plan_node_reboot(self, node: str, inj: NodeReboot) -> Plan:
        down_seconds = inj.down_seconds
        plan = self.plan_node_crash(node)
        rb_args = plan.rollback.args

        def after(rec_id: str, ledger: Ledger) -> None:
            time.sleep(down_seconds)
            rb_restart_daemons(rb_args)
            ledger.mark_reverted(rec_id, ok=True)

        plan.kind, plan.params, plan.after = "node-reboot", {"down_seconds": down_seconds}, after
        plan.summary = f"reboot {node}: kill its processes, {down_seconds:g} s down, start its daemons"
        return plan

    # ------------------------------------------------------------ fabric
    def _rail(self, node: str, rail: int) -> tuple[SandboxNode, str, str]:
        n = self._node(node)
        for link in n.fabric:
            if link.rail == rail:
                return n, link.ifname, link.peer
        raise InvalidActivity(f"node {node} has no fabric rail {rail} (rails: {[x.rail for x in n.fabric]})")

    def plan_link_down(self, node: str, inj: LinkDown) -> Plan:
        rail = inj.rail
        _, _, peer = self._rail(node, rail)
        return Plan(
            "link-down",
            {"node": node, "rail": rail, "link": peer},
            {},
            Rollback("sandbox.link-up",
                     {"peer": peer, "node": node, "slurm_prefix": self._slurm_prefix_of(node)}),
            lambda: (sysops.run(["ip", "link", "set", peer, "down"]), {})[1],
            f"ip link set {peer} down (rail {rail} of {node}, cable pull)",
            {node},
        )

    def plan_switch_down(self, node: str, inj: SwitchDown) -> Plan:
        """Every port of `rail` behind the leaf switch of `node` goes down at once (correlated)."""
        rail = inj.rail
        n = self._node(node)
        if n.leaf is None:
            raise ActivityFailed("this sandbox's state names no leaf groups: rebuild it (sandbox up)")
        leaf_nodes = [x for x in self.state.nodes if x.role != "head" and x.leaf == n.leaf]
        peers = [self._rail(x.name, rail)[2] for x in leaf_nodes]
        names = [x.name for x in leaf_nodes]

        def apply() -> dict[str, Any]:
            for peer in peers:
                sysops.run(["ip", "link", "set", peer, "down"])
            return {"nodes": names}

        return Plan(
            "switch-down",
            {"node": node, "leaf": n.leaf, "rail": rail, "nodes": names},
            {},
            Rollback("sandbox.links-up",
                     {"peers": peers, "nodes": names, "slurm_prefix": self._slurm_prefix()}),
            apply,
            f"leaf switch {n.leaf} rail {rail} down: {', '.join(peers)} (nodes {', '.join(names)})",
            set(names),
        )

    def plan_nic_remove(self, node: str, inj: NicRemove) -> Plan:
        """The node's fabric device of `rail` disappears (renamed away and down: the kernel no longer
        has an interface by that name, as when an HCA drops off PCIe)."""
        rail = inj.rail
        n, ifname, _ = self._rail(node, rail)
        hidden = f"gone{rail}"

        def apply() -> dict[str, Any]:
            sysops.run(["ip", "-n", n.netns, "link", "set", ifname, "down"])
            sysops.run(["ip", "-n", n.netns, "link", "set", ifname, "name", hidden])
            return {}

        return Plan(
            "nic-remove",
            {"node": node, "rail": rail, "ifname": ifname},
            {},
            Rollback("sandbox.nic-restore", {"netns": n.netns, "hidden": hidden, "ifname": ifname,
                                             "node": node, "slurm_prefix": self._slurm_prefix_of(node)}),
            apply,
            f"{ifname} of {node} gone (renamed {hidden}, down)",
            {node},
        )

    def plan_link_flap(self, node: str, inj: LinkFlap) -> Plan:
        rail, period_seconds, count = inj.rail, inj.period_seconds, inj.count  # bounds: the model's
        _, _, peer = self._rail(node, rail)
        stop = threading.Event()
        flap_id = f"{peer}-{time.monotonic_ns()}"
        slurm_prefix = self._slurm_prefix_of(node)

        def after(rec_id: str, ledger: Ledger) -> None:
            FLAPPERS[flap_id] = stop

            def loop() -> None:
                try:
                    for _ in range(count):
                        sysops.run(["ip", "link", "set", peer, "down"], check=False)
                        if stop.wait(period_seconds / 2):
                            break
                        sysops.run(["ip", "link", "set", peer, "up"], check=False)
                        if stop.wait(period_seconds / 2):
                            break
                finally:
                    if link_exists(peer):
                        sysops.run(["ip", "link", "set", peer, "up"], check=False)
                        # A health check that ran during a down phase drained the node; the flap
                        # is over, so return it to service as the link-up rollback does.
                        resume_node(slurm_prefix, node)
                    if FLAPPERS.pop(flap_id, None) is not None:
                        ledger.mark_reverted(rec_id, ok=True)

            threading.Thread(target=loop, name=f"flap-{peer}", daemon=True).start()

        return Plan(
            "link-flap",
            {"node": node, "rail": rail, "link": peer},
            {"period_seconds": period_seconds, "count": count},
            Rollback(
                "sandbox.link-up",
                {"peer": peer, "flap_id": flap_id, "node": node, "slurm_prefix": self._slurm_prefix_of(node)},
            ),
            lambda: {},
            f"flap {peer} {count} times, period {period_seconds:g} s",
            set(),
            after,
        )

    def plan_link_degrade(self, node: str, inj: LinkDegrade) -> Plan:
        rail, loss_percent, rate_mbit = inj.rail, inj.loss_percent, inj.rate_mbit  # bounds: the model's
        n, ifname, _ = self._rail(node, rail)
        table = nft_table(ifname)
        ns = n.netns
        rb = Rollback(
            "sandbox.link-restore",
            {
                "netns": ns,
                "ifname": ifname,
                "nft_table": table if loss_percent is not None else None,
                "tc": rate_mbit is not None,
            },
        )

        def apply() -> dict[str, Any]:
            if loss_percent is not None:
                sysops.run(["ip", "netns", "exec", ns, *nft_loss_argv(table, ifname, loss_percent)])
            if rate_mbit is not None:
                sysops.run(["ip", "netns", "exec", ns, *tbf_argv(ifname, rate_mbit)])
            return {}

        return Plan(
            "link-degrade",
            {"node": node, "rail": rail, "link": ifname},
            {"loss_percent": loss_percent, "rate_mbit": rate_mbit},
            rb,
            apply,
            f"degrade {ifname} in {ns}: loss {loss_percent}%, rate {rate_mbit} Mbit/s",
        )

    # ------------------------------------------------------------ scheduler
    def plan_slurm_state_loss(self, inj: SlurmStateLoss) -> Plan:
        return slurm_state_fault.plan(self.state, self.stack, self.state_root, inj.scope)

    # ------------------------------------------------------------ storage
    def plan_storage_outage(self) -> Plan:
        path = self.state.checkpoint_dir
        if not path:
            raise ActivityFailed("the sandbox state names no checkpoint_dir")
        netns = [n.netns for n in self.state.nodes]
        targets = mount_namespaces(netns)
        in_nodes = max([mounted(g[0], path) for g in targets.values()] or [0])
        base = {"root": mounted(None, path), "ns": in_nodes}
        rb = Rollback("sandbox.storage-restore", {"path": path, "netns": netns, "base_mounts": base})

        def apply() -> dict[str, Any]:
            # A read-only bind mount over the checkpoint directory in every mount namespace that uses
            # it (the root one is private here, so mounts do not propagate into `ip netns exec`
            # children): writes fail with EROFS as on a store that lost its write path.
            sysops.run(["mount", "--bind", path, path])
            sysops.run(["mount", "-o", "remount,bind,ro", path])
            done = 1
            for pids in mount_namespaces(netns).values():
                if run_in_mount_namespace(pids, ["mount", "--bind", path, path]):
                    # A namespace whose processes all exit before the remount is gone with them.
                    run_in_mount_namespace(pids, ["mount", "-o", "remount,bind,ro", path])
                    done += 1
            return {"mount_namespaces": done}

        return Plan(
            "storage-outage",
            {"path": path},
            {"mode": "read-only"},
            rb,
            apply,
            f"read-only bind mount over {path} in every sandbox mount namespace",
        )

    # ------------------------------------------------------------ workload
    def plan_kill_rank(self, inj: KillRank) -> Plan:
        rank = inj.rank
        found: list[tuple[int, int, str]] = []
        for n in self.state.nodes:
            if n.role == "head" or not netns_exists(n.netns):
                continue
            for pid in sysops.netns_pids(n.netns):
                env = sysops.environ(pid) or {}
                cmd = sysops.cmdline(pid) or []
                # Slurm gives each task its rank as SLURM_PROCID (torchrun-style launchers: RANK).
                ids = (env.get("SLURM_PROCID"), env.get("RANK"))
                if str(rank) in ids and any("python" in c for c in cmd[:2]):
                    st = start_time(pid)
                    if st is not None:
                        found.append((pid, st, n.name))
        if not found:
            raise ActivityFailed(f"no training process with SLURM_PROCID/RANK={rank} in the sandbox's nodes")
        procs = [(p, st) for p, st, _ in found]

        def apply() -> dict[str, Any]:
            return {"killed": sysops.kill_all(procs)}

        return Plan(
            "kill-rank",
            {"rank": rank, "node": found[0][2]},
            {"pids": [p for p, _ in procs]},
            Rollback("noop", {"why": "the workload restarts a killed rank itself"}),
            apply,
            f"SIGKILL rank {rank} (pids {[p for p, _ in procs]} on {found[0][2]})",
        )
