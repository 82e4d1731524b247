"""The Slurm backend: a real Slurm cluster reached from a login/admin host.

Observations run locally (`sinfo`, `scontrol`). Faults run on the node over ssh, with argv built by
the pure functions below (unit-tested; no ssh target exists on the machines this project is
tested on, so the end-to-end path of this backend is untested here — docs/chaos.md says so):
- GPU: `dcgmi test --inject --gpuid <id> -f <fieldId> -v <value>` writes DCGM's field cache so
  health watches and dcgm-exporter react; with `kmsg`, an `NVRM: Xid` line is written to /dev/kmsg
  so log-based monitors react too (gpu-faults.md). Clearing injects value 0.
- Links: `ip link set <if> down` runs DETACHED on the node with its own `ip link set <if> up` after
  `hold_seconds`, so a fault never outlives the runner even when ssh cannot reach the node again.
- Degraded: `tc qdisc replace ... tbf` (rate) and an nftables `numgen random` drop rule (loss).
- Node crash/hang act on slurmd only (SIGKILL / SIGSTOP via systemctl): a real power cut needs
  out-of-band management (IPMI/BMC) that this backend does not drive.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from chaoslib.exceptions import InvalidActivity

from gpufleet.catalog.injection import (
    DcgmInject,
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
    StorageOutage,
    StorageSlow,
    SwitchDown,
)
from gpufleet.chaos import sysops
from gpufleet.chaos.backends.base import (
    Backend,
    NodeInfo,
    Plan,
    nft_delete_argv,
    nft_loss_argv,
    nft_table,
    tbf_argv,
)
from gpufleet.chaos.ledger import Rollback
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo

DEFAULT_HOLD_SECONDS = 600  # longest a link stays down if nobody reverts it


# ----------------------------------------------------------------------------- pure argv builders


def ssh_argv(ssh: tuple[str, ...] | list[str], host: str, remote: list[str]) -> list[str]:
    """ssh joins its remote arguments into one shell command line: quote each word."""
    if not host or host.startswith("-"):
        raise InvalidActivity(f"bad host name {host!r}")
    return [*ssh, host, "--", shlex.join(remote)]


def dcgmi_inject_argv(gpu: int, field_id: int, value: float | int) -> list[str]:
    v = int(value) if float(value).is_integer() else value
    return ["dcgmi", "test", "--inject", "--gpuid", str(gpu), "-f", str(field_id), "-v", str(v)]


def kmsg_xid_line(xid: int, pci: str, pid: int = 0, text: str = "injected by gpufleet chaos") -> str:
    """The driver's log format: `NVRM: Xid (PCI:0000:xx:00): <code>, pid=<pid>, <text>`."""
    return f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, {text}"


def kmsg_argv(line: str, burst: int = 1) -> list[str]:
    """Write `line` to /dev/kmsg `burst` times (one record per write, as the driver logs them)."""
    if not 1 <= burst <= 1000:
        raise InvalidActivity("burst must be 1..1000")
    q = shlex.quote(line)
    if burst == 1:
        return ["sh", "-c", f"echo {q} > /dev/kmsg"]
    return ["sh", "-c", f"i=0; while [ $i -lt {burst} ]; do echo {q} > /dev/kmsg; i=$((i+1)); done"]


def detached(script: str) -> list[str]:
    """Run a shell script detached from the ssh session (it survives the connection)."""
    return ["setsid", "-f", "sh", "-c", script]


def link_down_argv(ifname: str, hold_seconds: float) -> list[str]:
    i = shlex.quote(ifname)
    return detached(f"ip link set {i} down; sleep {hold_seconds:g}; ip link set {i} up")


def link_up_argv(ifname: str) -> list[str]:
    return ["ip", "link", "set", ifname, "up"]


def link_flap_argv(ifname: str, period_seconds: float, count: int) -> list[str]:
    i, half = shlex.quote(ifname), period_seconds / 2
    return detached(
        f"n=0; while [ $n -lt {count} ]; do ip link set {i} down; sleep {half:g}; "
        f"ip link set {i} up; sleep {half:g}; n=$((n+1)); done; ip link set {i} up"
    )




def tc_clear_argv(ifname: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", ifname, "root"]


def scontrol_resume_argv(node: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=resume"]


def scontrol_drain_argv(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def slurmd_signal_argv(sig: str) -> list[str]:
    return ["systemctl", "kill", f"--signal={sig}", "slurmd"]


def slurmd_start_argv() -> list[str]:
    return ["systemctl", "start", "slurmd"]


# ----------------------------------------------------------------------------- rollbacks


def rb_ssh(args: dict[str, Any]) -> None:
    for argv in args["commands"]:
        sysops.run(argv, check=bool(args.get("check", True)))


# ----------------------------------------------------------------------------- backend


class SlurmBackend(Backend):
    name = "slurm"
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset({
        DcgmInject, NodeCrash, NodeHang, LinkDown, LinkFlap, LinkDegrade,
    })
    not_offered: ClassVar[Mapping[type[InjectionModel], str]] = {
        NodeReboot: "a reboot that comes back by itself needs out-of-band power control (a BMC)",
        GpuHang: "a real GPU hang cannot be caused from outside: no DCGM injection or driver "
        "interface stops a GPU's engines; it needs a kernel that spins on the device (not shipped)",
        SwitchDown: "a leaf switch is not reachable over ssh from the nodes",
        NicRemove: "removing a PCIe device needs out-of-band access to the host",
        HostSignal: "BMC sensors, EDAC counters and disk state are hardware: no ssh command sets them",
        StorageOutage: "the backend does not know the cluster's checkpoint store",
        StorageSlow: "the backend does not know the cluster's checkpoint store",
        KillRank: "finding a rank's process needs the job's step layout (not implemented)",
    }

    def __init__(
        self,
        ssh: tuple[str, ...],
        fabric_ifname: str,
        prometheus_url: str | None,
        pci_bus_ids: dict[int, str] | None = None,
    ) -> None:
        self.ssh = ssh
        self.fabric_ifname = fabric_ifname
        self._prom = prometheus_url
        self.pci = pci_bus_ids or {}

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(n, "compute") for n in self.node_states()]

    def node_states(self) -> dict[str, NodeObs]:
        return parse_sinfo(sysops.run(list(SINFO_ARGS)))

    def prometheus_url(self) -> str | None:
        return self._prom

    def _on(self, node: str, argv: list[str]) -> list[str]:
        return ssh_argv(self.ssh, node, argv)

    def plan_dcgm_inject(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        fid, value = inj.field_id, inj.value
        cmds = [self._on(node, dcgmi_inject_argv(gpu, fid, value))]
        if inj.kmsg:
            line = kmsg_xid_line(int(value), self.pci.get(gpu, f"0000:{gpu:02x}:00"))
            cmds.append(self._on(node, kmsg_argv(line, inj.burst)))
        undo = [self._on(node, dcgmi_inject_argv(gpu, fid, 0))]

        def apply() -> dict[str, Any]:
            for c in cmds:
                sysops.run(c)
            return {}

        return Plan(
            "dcgm-inject",
            {"node": node, "gpu": gpu},
            inj.params(),
            Rollback("slurm.ssh", {"commands": undo}),
            apply,
            f"ssh {node}: {' '.join(dcgmi_inject_argv(gpu, fid, value))}",
        )

    def _simple(
        self,
        kind: str,
        node: str,
        do: list[list[str]],
        undo: list[list[str]],
        summary: str,
        down: bool,
        params: dict[str, Any] | None = None,
        target: dict[str, Any] | None = None,
    ) -> Plan:
        def apply() -> dict[str, Any]:
            for c in do:
                sysops.run(c)
            return {}

        return Plan(
            kind,
            target or {"node": node},
            params or {},
            Rollback("slurm.ssh", {"commands": undo, "check": False}),
            apply,
            summary,
            {node} if down else set(),
        )

    def plan_node_crash(self, node: str) -> Plan:
        return self._simple(
            "node-crash",
            node,
            [self._on(node, slurmd_signal_argv("SIGKILL"))],
            [self._on(node, slurmd_start_argv()), scontrol_resume_argv(node)],
            f"ssh {node}: SIGKILL slurmd (daemon crash; a power cut needs a BMC)",
            True,
        )

    def plan_node_hang(self, node: str, inj: NodeHang) -> Plan:
        if inj.reboot_on_restore:
            raise InvalidActivity(
                "node-hang with reboot_on_restore needs out-of-band power control (a BMC): not offered "
                "by the slurm backend; restore thaws slurmd instead"
            )
        return self._simple(
            "node-hang",
            node,
            [self._on(node, slurmd_signal_argv("SIGSTOP"))],
            [self._on(node, slurmd_signal_argv("SIGCONT")), scontrol_resume_argv(node)],
            f"ssh {node}: SIGSTOP slurmd",
            True,
        )

    def _if(self, rail: int) -> str:
        return self.fabric_ifname.format(rail=rail)

    def plan_link_down(self, node: str, inj: LinkDown) -> Plan:
        rail = inj.rail
        i = self._if(rail)
        return self._simple(
            "link-down",
            node,
            [self._on(node, link_down_argv(i, DEFAULT_HOLD_SECONDS))],
            [self._on(node, link_up_argv(i))],
            f"ssh {node}: ip link set {i} down (self-restores after {DEFAULT_HOLD_SECONDS} s)",
            True,
            {"hold_seconds": DEFAULT_HOLD_SECONDS},
            {"node": node, "rail": rail, "link": i},
        )

    def plan_link_flap(self, node: str, inj: LinkFlap) -> Plan:
        rail, period_seconds, count = inj.rail, inj.period_seconds, inj.count
        i = self._if(rail)
        return self._simple(
            "link-flap",
            node,
            [self._on(node, link_flap_argv(i, period_seconds, count))],
            [self._on(node, link_up_argv(i))],
            f"ssh {node}: flap {i} x{count}",
            False,
            {"period_seconds": period_seconds, "count": count},
            {"node": node, "rail": rail, "link": i},
        )

    def plan_link_degrade(self, node: str, inj: LinkDegrade) -> Plan:
        rail, loss_percent, rate_mbit = inj.rail, inj.loss_percent, inj.rate_mbit
        i = self._if(rail)
        table = nft_table(i)
        do, undo = [], []
        if loss_percent is not None:
            do.append(self._on(node, nft_loss_argv(table, i, loss_percent)))
            undo.append(self._on(node, nft_delete_argv(table)))
        if rate_mbit is not None:
            do.append(self._on(node, tbf_argv(i, rate_mbit)))
            undo.append(self._on(node, tc_clear_argv(i)))
        if not do:
            raise InvalidActivity("link degrade needs loss_percent and/or rate_mbit")
        return self._simple(
            "link-degrade",
            node,
            do,
            undo,
            f"ssh {node}: degrade {i}",
            False,
            {"loss_percent": loss_percent, "rate_mbit": rate_mbit},
            {"node": node, "rail": rail, "link": i},
        )
