"""What every backend offers: observations of the cluster and fault plans.

A Plan says what a fault is, which rollback undoes it (a name + JSON-able arguments, so that
`gpufleet chaos revert` can undo it with nothing but the ledger), and how to apply it. The engine
writes the plan to the ledger BEFORE calling `apply`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.chaos.ledger import Ledger, Rollback
from gpufleet.chaos.scheduler import NodeObs


@dataclass
class Plan:
    kind: str  # catalog injection method
    target: dict[str, Any]
    params: dict[str, Any]
    rollback: Rollback
    apply: Callable[[], dict[str, Any]]
    summary: str
    nodes_down: set[str] = field(default_factory=set)  # nodes this fault takes out of service
    # Called after apply with the ledger id, for faults that end themselves (flap, reboot).
    after: Callable[[str, Ledger], None] | None = None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    role: str  # compute | spare | head


class Backend:
    name = "base"

    # ------------------------------------------------------------ observations
    def nodes(self) -> list[NodeInfo]:
        raise NotImplementedError

    def node_states(self) -> dict[str, NodeObs]:
        raise NotImplementedError

    def prometheus_url(self) -> str | None:
        return None

    def job_nodes(self) -> list[str]:
        """Nodes the training job runs on now, in Slurm's order (empty when it is not running)."""
        return []

    def workload_events(self) -> str | None:
        """Path of the training events JSONL, where the backend has one."""
        return None

    def dead_daemons(self) -> list[str]:
        """Cluster daemons the backend knows of that are not running (steady-state check)."""
        return []

    def training_note(self) -> str:
        """Why the training job is not running, when the platform says (e.g. its auto-resume
        controller spent its restart budget); empty when it says nothing."""
        return ""

    # ------------------------------------------------------------ healing (steady.py)
    def restart_dead_daemons(self) -> list[str]:
        raise ActivityFailed(f"backend {self.name} cannot restart daemons: heal the cluster by hand")

    def resume_node(self, node: str) -> None:
        raise ActivityFailed(f"backend {self.name} cannot resume node {node}: resume it by hand")

    def resume_training(self) -> str:
        raise ActivityFailed(f"backend {self.name} cannot resubmit the training job: resubmit it by hand")

    # ------------------------------------------------------------ faults
    def _unsupported(self, method: str, why: str = "") -> InvalidActivity:
        return InvalidActivity(f"backend {self.name} cannot inject {method}{': ' + why if why else ''}")

    def plan_dcgm_inject(self, node: str, gpu: int, params: dict[str, Any]) -> Plan:
        raise self._unsupported("dcgm-inject")

    def plan_node_crash(self, node: str) -> Plan:
        raise self._unsupported("node-crash")

    def plan_node_hang(self, node: str, reboot_on_restore: bool = False) -> Plan:
        raise self._unsupported("node-hang")

    def plan_node_reboot(self, node: str, down_seconds: float) -> Plan:
        raise self._unsupported("node-reboot")

    def plan_link_down(self, node: str, rail: int) -> Plan:
        raise self._unsupported("link-down")

    def plan_link_flap(self, node: str, rail: int, period_seconds: float, count: int) -> Plan:
        raise self._unsupported("link-flap")

    def plan_link_degrade(
        self, node: str, rail: int, loss_percent: float | None, rate_mbit: float | None
    ) -> Plan:
        raise self._unsupported("link-degrade")

    def plan_storage_outage(self) -> Plan:
        raise self._unsupported("storage-outage")

    def plan_storage_slow(self, rate_mbit: float) -> Plan:
        raise self._unsupported("storage-slow")

    def plan_kill_rank(self, rank: int) -> Plan:
        raise self._unsupported("kill-rank")

    def plan_host_signal(
        self, node: str, signal: str, value: float | None, add: float | None, effect: str | None
    ) -> Plan:
        raise self._unsupported("host-signal")

    def plan_switch_down(self, node: str, rail: int) -> Plan:
        raise self._unsupported("switch-down")

    def plan_nic_remove(self, node: str, rail: int) -> Plan:
        raise self._unsupported("nic-remove")


def tbf_argv(ifname: str, rate_mbit: float) -> list[str]:
    """`tc` argv capping `ifname` at `rate_mbit` with a token bucket (the sandbox and Slurm backends
    share it). burst >= rate/HZ (tc-tbf(8)); 32 kbit is enough up to ~250 Mbit/s at HZ=1000."""
    burst_kbit = max(32, int(rate_mbit * 1000 / 250))
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        f"{rate_mbit:g}mbit",
        "burst",
        f"{burst_kbit}kbit",
        "latency",
        "400ms",
    ]
