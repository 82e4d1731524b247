"""`gpufleet upgrade run --driver slurm`: the rollout's reboots done by Slurm itself, `scontrol
reboot ASAP nextstate=DOWN reason=<mark> <node>` and the cluster's RebootProgram (ADR 0064,
docs/fleet-upgrade.md "The Slurm driver").

What Slurm 22.05 does, as scontrol(1) says and the sandbox's slurmctld showed (ADR 0064):
- `reboot` marks the node REBOOT_REQUESTED; once it is idle slurmctld sends the reboot to slurmd
  (state DOWN+DRAIN+REBOOT_ISSUED, reason `<reason> : reboot issued`), slurmd runs RebootProgram,
  and the reboot is complete when the node registers with a boot time no older than the request.
- ASAP drains the node at once, so no job is placed on it while it waits for its running jobs; it
  does not stop them (they run to their end unless the rollout's Evict stops them).
- `nextstate=RESUME` returns the node to service as it registers, before anything but Slurm's own
  HealthCheckProgram has run: seen on the sandbox as IDLE with no reason at registration. So the
  rollout asks for `nextstate=DOWN` (the node registers DOWN with `... : reboot complete` and takes
  no job) and resumes it itself after its gate, as it does after any cordon.
- A node that has not registered within ResumeTimeout (slurm.conf(5), default 60 s) is left DOWN
  with `... : reboot timed out`.

Jobs (Evict): a job that allows requeueing (`Requeue=1` in `scontrol show job`) is requeued
(`scontrol requeue`: back to pending, started again elsewhere); the others are cancelled
(`scancel`), which on the sandbox is how training is resubmitted from its newest checkpoint by
the auto-resume controller (its jobs are `--no-requeue`).

The node's new version must be in place before the reboot: on a real cluster the package install
that RebootProgram's boot picks up; on the sandbox, the node agent's recorded recipe, which the
sandbox's RebootProgram (gpufleet.sandbox.node_reboot) starts. Observation (the live snapshot, the
version read back, the gate) is the sandbox driver's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufleet.core.sandbox_contract import read_state
from gpufleet.core.slurm_state import parse_slurm_time
from gpufleet.fleet.upgrade.gate import GateSetup
from gpufleet.fleet.upgrade.model import Component
from gpufleet.fleet.upgrade.sandbox_driver import PoolShape, Runner, SandboxDriver, run_command
from gpufleet.fleet.upgrade.sandbox_ops import show_node_argv, upgraded_recipe

log = logging.getLogger("gpufleet.fleet.upgrade")

POLL_S = 0.5
# How long `--resume-cleanup` lets a reboot under way finish: the sandbox's ResumeTimeout (180 s; its
# slurm.conf), after which slurmctld gives the reboot up itself.
CLEANUP_REBOOT_WAIT_S = 180.0
REBOOTING = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
# The suffixes slurmctld appends to a rebooting node's reason (scontrol(1), reboot).
SLURM_REBOOT_SUFFIXES = ("reboot issued", "reboot complete", "reboot timed out")
# How long a resumed node may still show "not responding" (`idle*`). slurmctld pings every node each
# SlurmdTimeout/3 s (slurm.conf(5), SlurmdTimeout) and clears the flag at the next answered ping; a
# ping that failed while the node's slurmd was being replaced can set it after the new slurmd has
# registered (seen in CI: `idle*` 6 s after "reboot complete"). 60 s covers the sandbox's
# SlurmdTimeout (10 s) several times over.
RETURN_WAIT_S = 60.0


class NextState(StrEnum):
    DOWN = "DOWN"
    RESUME = "RESUME"


# The rollout's choice: the node must not take a job before its gate (module docstring).
NEXT_STATE = NextState.DOWN


def reboot_argv(prefix: Sequence[str], node: str, reason: str, next_state: NextState = NEXT_STATE,
                asap: bool = True) -> list[str]:
    """`scontrol reboot [ASAP] nextstate=<S> reason=<reason> <node>` behind the cluster's command
    prefix (the sandbox's: its head namespace and SLURM_CONF)."""
    return [*prefix, "scontrol", "reboot", *(["ASAP"] if asap else []), f"nextstate={next_state.value}",
            f"reason={reason}", node]


def requeue_argv(prefix: Sequence[str], job_ids: Sequence[str]) -> list[str]:
    return [*prefix, "scontrol", "requeue", ",".join(job_ids)]


def cancel_argv(prefix: Sequence[str], job_ids: Sequence[str]) -> list[str]:
    return [*prefix, "scancel", *job_ids]


def show_jobs_argv(prefix: Sequence[str]) -> list[str]:
    return [*prefix, "scontrol", "-o", "show", "job"]


def _fields(line: str) -> dict[str, str]:
    """`Key=value` tokens of one `scontrol -o show` line (values with spaces are cut at the first
    space: only State, BootTime, JobId and Requeue are read, none of which has one)."""
    out: dict[str, str] = {}
    for tok in line.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out.setdefault(k, v)
    return out


def requeue_flags(text: str) -> dict[str, bool]:
    """Job id -> whether Slurm may requeue it (`Requeue=1`), from `scontrol -o show job`."""
    out = {}
    for line in text.splitlines():
        f = _fields(line)
        if "JobId" in f:
            out[f["JobId"]] = f.get("Requeue") == "1"
    return out


def split_evictions(job_ids: Sequence[str], requeueable: dict[str, bool]) -> tuple[list[str], list[str]]:
    """(jobs to requeue, jobs to cancel): a job Slurm does not know (gone meanwhile) is cancelled,
    which is harmless."""
    requeue = [j for j in job_ids if requeueable.get(j, False)]
    return requeue, [j for j in job_ids if j not in requeue]


@dataclass(frozen=True)
class NodeView:
    """A node as `scontrol -o show node` shows it."""

    flags: frozenset[str]  # State=IDLE+DRAIN+REBOOT_ISSUED -> {"IDLE", "DRAIN", "REBOOT_ISSUED"}
    boot_time: float | None
    state: str


def parse_show_node(text: str, tz_offset: float | None = None) -> NodeView:
    f = _fields(text.strip().splitlines()[0] if text.strip() else "")
    state = f.get("State", "")
    boot = parse_slurm_time(f.get("BootTime", ""), tz_offset)
    return NodeView(frozenset(s for s in state.split("+") if s), boot, state)


class Progress(StrEnum):
    PENDING = "pending"
    DONE = "done"
    TIMED_OUT = "timed out"


def reboot_progress(view: NodeView, reason: str, requested_at: float) -> Progress:
    """Where a requested reboot stands: done once Slurm has cleared its reboot flags and the node
    registered (responding) with a boot time no older than the request (whole seconds, as Slurm
    prints it); timed out when slurmctld gave up (ResumeTimeout)."""
    if reason.endswith("reboot timed out"):
        return Progress.TIMED_OUT
    if view.flags & (REBOOTING | {"NOT_RESPONDING"}):
        return Progress.PENDING
    if view.boot_time is None or view.boot_time < int(requested_at):
        return Progress.PENDING
    return Progress.DONE


def owns(reason: str | None, mark: str) -> bool:
    """The node's reason is still the rollout's mark, with at most Slurm's reboot suffixes after it
    (`<mark> : reboot issued : reboot complete`): anyone else's reason means someone else holds it."""
    if reason is None or not mark:
        return False
    if reason == mark:
        return True
    if not reason.startswith(mark + " : "):
        return False
    rest = reason[len(mark) + 3:].split(" : ")
    return all(part in SLURM_REBOOT_SUFFIXES for part in rest)


@dataclass
class RebootRecord:
    """One `scontrol reboot` as Slurm showed it (the report's `slurmReboots`)."""

    node: str
    version: str
    requested_at: float
    boot_time_before: float | None
    boot_time_after: float | None = None
    states: list[str] = field(default_factory=list)
    reason: str = ""
    outcome: str = Progress.PENDING.value
    seconds: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return {"node": self.node, "version": self.version, "requestedAt": self.requested_at,
                "bootTimeBefore": self.boot_time_before, "bootTimeAfter": self.boot_time_after,
                "states": self.states, "reason": self.reason, "outcome": self.outcome,
                "seconds": round(self.seconds, 2)}


class SlurmDriver(SandboxDriver):
    """The sandbox driver with Slurm's reboot: stage the version, `scontrol reboot ASAP nextstate=DOWN`,
    wait for Slurm to see the node boot again; evictions requeue what may be requeued."""

    def __init__(self, stack: str, component: Component, root: Path | None = None,
                 runner: Runner = run_command, gate_setup: GateSetup | None = None,
                 pools: dict[str, PoolShape] | None = None, pool_of: dict[str, str] | None = None) -> None:
        super().__init__(stack, component, root, runner, gate_setup, pools, pool_of)
        self.reboots: list[RebootRecord] = []

    @property
    def prefix(self) -> list[str]:
        return self.state.slurm_command()

    def evict(self, job_ids: tuple[str, ...]) -> None:
        if not job_ids:
            return
        res = self.run(show_jobs_argv(self.prefix))
        flags = requeue_flags(res.stdout) if res.returncode == 0 else {}
        requeue, cancel = split_evictions(job_ids, flags)
        for argv in ([requeue_argv(self.prefix, requeue)] if requeue else []) + (
                [cancel_argv(self.prefix, cancel)] if cancel else []):
            out = self.run(argv)
            if out.returncode != 0:  # a job that ended meanwhile is no error here
                log.warning("%s: %s", " ".join(argv[-3:]), out.stderr.strip())

    def stage(self, node: str, version: str) -> None:
        """Put the version the node boots into in place: the node agent's recorded recipe (a real
        node's package install)."""
        self.state = read_state(self.stack, self.root)
        updated = {p.name: p.model_copy(update={"launch": upgraded_recipe(p.launch, self.component, version)})
                   for p in self.state.processes if p.node == node and p.name.startswith("agent@")}
        self._save_processes(updated)

    def view(self, node: str) -> NodeView:
        return parse_show_node(self._cmd(show_node_argv(self.state, node)))

    def reboot(self, node: str, version: str, timeout_s: float) -> str | None:
        """Stage `version`, ask Slurm to reboot the node, wait (at most `timeout_s`) for Slurm to see
        it boot and for its agent to answer; the version the agent then reports, or None."""
        t0 = time.monotonic()
        self.stage(node, version)
        before = self.view(node)
        requested_at = time.time()
        rec = RebootRecord(node, version, round(requested_at, 2), before.boot_time)
        self.reboots.append(rec)
        self._cmd(reboot_argv(self.prefix, node, self.record.mark, NEXT_STATE))
        end = t0 + timeout_s
        try:
            while time.monotonic() < end:
                view = self.view(node)
                obs = self.sinfo().get(node)
                if not rec.states or rec.states[-1] != view.state:
                    rec.states.append(view.state)
                progress = reboot_progress(view, obs.reason if obs else "", requested_at)
                rec.reason = obs.reason if obs else ""
                if progress is Progress.TIMED_OUT:
                    rec.outcome = progress.value
                    return None
                if progress is Progress.DONE:
                    rec.boot_time_after = view.boot_time
                    reported = self.version(node)
                    if reported is not None:
                        rec.outcome = progress.value
                        return reported
                time.sleep(POLL_S)
            rec.outcome = "no reboot within the rollout's rebootTimeoutSeconds"
            return None
        finally:
            rec.seconds = time.monotonic() - t0

    def uncordon(self, node: str) -> bool:
        """Resume the node (the sandbox driver's rule: only if its reason is still this run's mark),
        then wait until Slurm shows it schedulable: returned means able to take a job, not only
        resumed (RETURN_WAIT_S). A node still not schedulable then is returned with a warning."""
        if not super().uncordon(node):
            return False
        end = time.monotonic() + RETURN_WAIT_S
        while True:
            obs = self.sinfo().get(node)
            if obs is not None and obs.schedulable:
                return True
            if time.monotonic() >= end:
                log.warning("%s: resumed, but Slurm still shows it %s after %.0f s", node,
                            obs.state if obs else "missing", RETURN_WAIT_S)
                return True
            time.sleep(POLL_S)

    def restart_missing_daemons(self, node: str) -> list[str]:
        """After an interrupted run: let a reboot Slurm has under way finish first (its RebootProgram
        starts the daemons itself; starting them here too would race it), then start what is not
        running."""
        end = time.monotonic() + CLEANUP_REBOOT_WAIT_S
        while time.monotonic() < end and self.view(node).flags & REBOOTING:
            time.sleep(POLL_S)
        return super().restart_missing_daemons(node)

    def is_ours(self, reason: str) -> bool:
        """This run's mark, with the suffixes Slurm adds during a reboot (module docstring)."""
        return owns(reason, self.record.mark)

    def report(self) -> dict[str, Any]:
        return {"driver": "slurm", "nextState": NEXT_STATE.value,
                "slurmReboots": [r.to_doc() for r in self.reboots]}


DRIVERS = ("slurm", "sandbox", "gpu-operator")


def choose_driver(scheduler: str, requested: str | None) -> str:
    """The driver of `gpufleet upgrade run`: the one asked for, else the stack's scheduler's. `slurm`
    reboots through `scontrol reboot`; `sandbox` restarts the node's daemons without Slurm knowing
    (ADR 0061), kept to compare with; `gpu-operator` (Kubernetes: Kueue, Volcano) has the GPU
    Operator's upgrade controller upgrade each node the rollout hands it (ADR 0073)."""
    if requested is not None:
        if requested not in DRIVERS:
            raise ValueError(f"unknown driver {requested!r}: one of {', '.join(DRIVERS)}")
        return requested
    return "slurm" if scheduler == "slurm" else "gpu-operator"
