"""`gpufleet upgrade run` on the Slurm sandbox: the rollout state machine's actions performed on real
processes (docs/fleet-upgrade.md, ADR 0061).

- Cordon: `scontrol update state=DRAIN reason=<mark>`, after the node is written to the cordon
  record (so an interrupted run leaves nothing cordoned without a record: `--resume-cleanup`).
- Evict: `scancel` of the node's jobs; the auto-resume controller resubmits training from its
  latest checkpoint on the nodes left.
- Reboot: the node's daemons (slurmd, the node agent) are stopped and started again from their
  Launch recipes, the agent's with the new version; the state file records the new recipe and
  PIDs. Not `scontrol reboot`: slurmd in a network namespace reports the host's boot time, so
  slurmctld would never see the reboot complete (docs/fleet-upgrade.md).
- RunGate: the node health check (`python -m gpufleet.health --sandbox`, the HealthCheckProgram's
  checker) exits 0, the agent reports the target version and no load error, and `gpufleet inspect`'s
  checks pass on the node (gate.py) at the stack's `gate.inspectLevel`; on a full gate with the
  node's fabric bandwidth (inspect's TCP probe, the node sending to a peer) at or above
  `gate.performanceFloorPercent` of the pool's reference, measured on the idle nodes at the start.
- Uncordon: `scontrol update state=RESUME`, only while the node's reason is still this run's mark.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.procs import alive, launch
from gpufleet.core.sandbox_contract import Launch, read_state, state_path, write_state
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo
from gpufleet.fleet.inspect import sandbox as inspect_sb
from gpufleet.fleet.inspect.checks import Reference
from gpufleet.fleet.inspect.observation import NodeObservation as InspectObservation
from gpufleet.fleet.inspect.plan import plan_sweep
from gpufleet.fleet.inspect.reference import pool_references
from gpufleet.fleet.inspect.slurm_cluster import sched_state_of
from gpufleet.fleet.upgrade.gate import GateSetup, inspect_gate
from gpufleet.fleet.upgrade.model import Component, FleetSnapshot, Job, NodeObservation
from gpufleet.fleet.upgrade.sandbox_ops import (
    STATE_KEY,
    cancel_argv,
    cordon_argv,
    cordoned_by,
    health_argv,
    hold_argv,
    parse_squeue,
    resume_argv,
    show_node_argv,
    slurmd_start_time,
    smoke_argv,
    smoke_result,
    squeue_argv,
    upgraded_recipe,
)

log = logging.getLogger("gpufleet.fleet.upgrade")

COMMAND_TIMEOUT_S = 30.0
RECORD_FILE = "upgrade-cordons.json"
# A node whose agent did not answer this many health reads in a row (the rollout reads once a second)
# is unhealthy. One read is not enough: a read can fail while the node is busy (a burst of readers,
# a loaded machine), and NodeUnhealthy takes the node out of the rollout.
AGENT_SILENT_READS = 3
SILENT_RETRY_S = 0.5  # between the snapshot's reads of a silent agent


def agent_fault(doc: dict[str, Any]) -> str | None:
    """What an agent's GET /state says is wrong with its node: a driver load error or a GPU fault
    the health source holds; None when nothing."""
    if doc.get("driver_error"):
        return str(doc["driver_error"])
    held = [f"GPU {g.get('index')}: {g['fault'].get('fault_id')}" for g in doc.get("gpus", [])
            if isinstance(g.get("fault"), dict)]
    return "fault held by the health source: " + ", ".join(held) if held else None

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)


class DriverError(RuntimeError):
    """A command the driver needs failed (its stderr said why)."""


@dataclass(frozen=True)
class PoolShape:
    """What inspect expects of a pool's nodes (the stack's node pool and fabric)."""

    sku: AcceleratorModel
    gpus: int
    port_gbps: float | None


@dataclass
class CordonRecord:
    """The nodes a run cordoned and has not returned, on disk before each cordon."""

    path: Path
    rollout_id: str = ""
    mark: str = ""
    nodes: dict[str, str] = field(default_factory=dict)  # node -> "cordoned" | "held"

    @classmethod
    def load(cls, path: Path) -> CordonRecord:
        if not path.exists():
            return cls(path)
        doc = json.loads(path.read_text())
        return cls(path, str(doc.get("rolloutId", "")), str(doc.get("mark", "")), dict(doc.get("nodes", {})))

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rolloutId": self.rollout_id, "mark": self.mark, "nodes": self.nodes},
                                  indent=2))
        with open(tmp) as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def open_nodes(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s == "cordoned"]


def record_path(stack: str, root: Path | None) -> Path:
    return state_path(stack, root).parent / RECORD_FILE


class SandboxDriver:
    """Observes the sandbox and performs the rollout's actions on it."""

    def __init__(self, stack: str, component: Component, root: Path | None = None,
                 runner: Runner = run_command, gate_setup: GateSetup | None = None,
                 pools: dict[str, PoolShape] | None = None, pool_of: dict[str, str] | None = None) -> None:
        self.stack, self.component, self.root, self.run = stack, component, root, runner
        self.gate_setup, self.pools, self.pool_of = gate_setup, pools or {}, pool_of or {}
        self.state = read_state(stack, root)
        if self.state.phase != "up":
            raise DriverError(f"sandbox {stack} is {self.state.phase}, not up")
        token_file = self.state.agent_token_file
        self.token = Path(token_file).read_text().strip() if token_file else ""
        self.record = CordonRecord.load(record_path(stack, root))
        self._silent: dict[str, int] = {}  # node -> health reads in a row its agent did not answer

    # ------------------------------------------------------------------ observing

    def _cmd(self, argv: Sequence[str]) -> str:
        res = self.run(argv)
        if res.returncode != 0:
            raise DriverError(f"{' '.join(argv[-6:])}: rc {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def sinfo(self) -> dict[str, NodeObs]:
        return parse_sinfo(self._cmd(self.state.slurm_command(*SINFO_ARGS)))

    def jobs(self) -> dict[str, list[Job]]:
        return parse_squeue(self._cmd(squeue_argv(self.state)))

    def agent_state(self, node: str) -> dict[str, Any] | None:
        sock = self.state.node(node).agent_socket
        if sock is None or not Path(sock).exists():
            return None
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://agent",
                              headers={"Authorization": f"Bearer {self.token}"}, timeout=5.0) as c:
                r = c.get("/state")
                r.raise_for_status()
                doc: dict[str, Any] = r.json()
                return doc
        except (httpx.HTTPError, ValueError):
            return None

    def version(self, node: str) -> str | None:
        doc = self.agent_state(node)
        v = doc.get(STATE_KEY[self.component]) if doc else None
        return str(v) if v is not None else None

    def upgradable_nodes(self) -> list[str]:
        return [n.name for n in self.state.nodes if n.role in ("compute", "spare")]

    def snapshot(self, pool_of: dict[str, str], own_marks: frozenset[str] = frozenset()) -> FleetSnapshot:
        """The live fleet: every Slurm node, its version from its agent, who cordoned it (sinfo's
        reason), the jobs holding it. A node whose agent does not answer, or reports a load error,
        or holds a GPU fault, is unhealthy (left out: remediation owns it)."""
        sinfo, jobs = self.sinfo(), self.jobs()
        nodes = []
        for name in self.upgradable_nodes():
            doc = self.agent_state(name)
            for _ in range(AGENT_SILENT_READS - 1):  # silent: asked again before it is called so
                if doc is not None:
                    break
                time.sleep(SILENT_RETRY_S)
                doc = self.agent_state(name)
            version = doc.get(STATE_KEY[self.component]) if doc else None
            nodes.append(NodeObservation(
                name=name, pool=pool_of.get(name, "sandbox"),
                version=str(version) if version is not None else None,
                cordoned_by=cordoned_by(sinfo.get(name), own_marks),
                healthy=doc is not None and agent_fault(doc) is None,
                jobs=jobs.get(name, []),
            ))
        return FleetSnapshot(source="live", component=self.component, nodes=nodes)

    # ------------------------------------------------------------------ actions

    def cordon(self, node: str, reason: str) -> None:
        self.record.nodes[node] = "cordoned"
        self.record.save()  # on disk before the node is drained
        self._cmd(cordon_argv(self.state, node, reason))

    def evict(self, job_ids: tuple[str, ...]) -> None:
        if job_ids:
            # A job already gone is not an error for scancel's purpose here; its stderr is logged.
            res = self.run(cancel_argv(self.state, job_ids))
            if res.returncode != 0:
                log.warning("scancel %s: %s", " ".join(job_ids), res.stderr.strip())

    def is_ours(self, reason: str) -> bool:
        """Whether a node's drain reason is still this run's mark (never uncordon another's cordon)."""
        return reason == self.record.mark

    def uncordon(self, node: str) -> bool:
        """Resume the node if its reason is still this run's mark; False (left drained) otherwise."""
        obs = self.sinfo().get(node)
        if obs is None or not self.is_ours(obs.reason):
            log.warning("%s: reason is %r, not this rollout's mark: left as it is", node,
                        obs.reason if obs else None)
            self.record.nodes.pop(node, None)
            self.record.save()
            return False
        self._cmd(resume_argv(self.state, node))
        self.record.nodes.pop(node, None)
        self.record.save()
        return True

    def hold(self, node: str, reason: str) -> None:
        self._cmd(hold_argv(self.state, node, reason))
        self.record.nodes[node] = "held"
        self.record.save()

    def reboot(self, node: str, version: str, timeout_s: float) -> str | None:
        """Stop the node's daemons, start them again (the agent at `version`), and return the version
        the agent then reports; None when the node did not come back within `timeout_s`."""
        # Ctrl-C / SIGTERM wait until the new PIDs are in the state file: an interrupt between the
        # stop and the record would leave daemons that --resume-cleanup could not tell from dead ones.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        # Slurm prints SlurmdStartTime in whole seconds.
        restarted_at = float(int(time.time()))
        try:
            self._restart(node, version)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            registered = slurmd_start_time(self._cmd(show_node_argv(self.state, node)))
            obs = self.sinfo().get(node)
            reported = self.version(node)
            if (reported is not None and registered is not None and registered >= restarted_at
                    and obs is not None and obs.responding):
                return reported
            time.sleep(0.5)
        return None

    def _restart(self, node: str, version: str) -> None:
        self.state = read_state(self.stack, self.root)
        procs = [p for p in self.state.processes if p.node == node]
        for p in procs:
            if alive(p.pid, p.start_time):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(alive(p.pid, p.start_time) for p in procs):
            time.sleep(0.1)
        for p in procs:
            if alive(p.pid, p.start_time):
                os.kill(p.pid, signal.SIGKILL)
        updated = {}
        for p in procs:
            is_agent = p.name.startswith("agent@")
            recipe = upgraded_recipe(p.launch, self.component, version) if is_agent else p.launch
            if is_agent and self.state.node(node).agent_socket:
                Path(str(self.state.node(node).agent_socket)).unlink(missing_ok=True)
            popen, st = launch(recipe)
            if st is None:
                log.error("%s did not start (rc %s); see %s", p.name, popen.poll(), recipe.log)
                continue
            updated[p.name] = p.model_copy(update={"pid": popen.pid, "start_time": st, "launch": recipe})
        self._save_processes(updated)

    def _save_processes(self, updated: dict[str, Any]) -> None:
        state = read_state(self.stack, self.root)
        procs = [updated.get(p.name, p) for p in state.processes]
        self.state = state.model_copy(update={"processes": procs})
        write_state(self.state, self.root)

    def gate(self, node: str, version: str) -> tuple[bool, str]:
        """The node health check passes, and the agent reports `version` and no load error."""
        agent = next(p.launch for p in self.state.processes if p.name == f"agent@{node}")
        res = self.run(health_argv(self.state, self.state.node(node), agent))
        if res.returncode != 0:
            return False, f"node-health rc {res.returncode}: {res.stdout.strip()[:300]}"
        doc = self.agent_state(node)
        if doc is None:
            return False, "the node agent does not answer"
        if doc.get(STATE_KEY[self.component]) != version:
            return False, f"the agent reports {doc.get(STATE_KEY[self.component])}, not {version}"
        if doc.get("driver_error"):
            return False, str(doc["driver_error"])
        if self.gate_setup is None:
            return True, "node-health ok; version read back"
        obs = self.inspect_observation(node, doc)
        if obs is None:
            return False, f"node {node} has no pool shape to inspect it against"
        verdict = inspect_gate(obs, self.gate_setup, version)
        if not verdict.passed or self.gate_setup.smoke_ranks == 0:
            return verdict.passed, f"node-health ok; {verdict.detail}"
        try:
            smoke = self.run(smoke_argv(self.state, self.state.node(node), self.gate_setup.smoke_ranks))
        except subprocess.TimeoutExpired:
            return False, f"node-health ok; {verdict.detail}; the smoke run did not answer in time"
        except ValueError as e:  # a state file without the hosts file: the gate cannot pass
            return False, f"node-health ok; {verdict.detail}; no smoke run: {e}"
        passed, detail = smoke_result(smoke.returncode, smoke.stdout, smoke.stderr)
        return passed, f"node-health ok; {verdict.detail}; {detail}"

    # ------------------------------------------------------------------ inspect's checks in the gate

    def inspect_observation(self, node: str, doc: dict[str, Any]) -> InspectObservation | None:
        """The node as `gpufleet inspect` sees it (drained: the heavy checks may run), with its
        fabric bandwidth on a full gate: the node sends to a peer over rail 0 (inspect's probe)."""
        pool = self.pool_of.get(node, "sandbox")
        shape = self.pools.get(pool)
        if shape is None or self.gate_setup is None:
            return None
        obs = inspect_sb.observation_from_agent(
            doc, node=node, pool=pool, sku=shape.sku, expected_gpus=shape.gpus,
            expected_port_gbps=shape.port_gbps, sched_state="drained", at=time.time())
        if self.gate_setup.level != "full":
            return obs
        by_name = {n.name: n for n in self.state.nodes}
        peer = self._probe_peer(node)
        mbps = inspect_sb.probe_pair(by_name[node], by_name[peer]) if peer else None
        if mbps is None:
            why = ("no peer node to probe" if peer is None
                   else f"the bandwidth probe to {peer} measured nothing")
            return obs.model_copy(update={"unknown": (*obs.unknown, f"perf: {why}")})
        return obs.model_copy(update={"perf": {inspect_sb.PERF_METRIC: mbps}})

    def _probe_peer(self, node: str) -> str | None:
        """A node of the same pool that is in service and not this one (its receiver is light)."""
        sinfo = self.sinfo()
        pool = self.pool_of.get(node, "sandbox")
        for name in self.upgradable_nodes():
            obs = sinfo.get(name)
            if (name != node and self.pool_of.get(name, "sandbox") == pool and obs is not None
                    and obs.schedulable):
                return name
        return None

    def measure_references(self) -> dict[str, dict[str, Reference]]:
        """Each pool's performance reference for the full gate, as `gpufleet inspect --level full`
        computes it (the SKU's published figure, else the pool's median), measured once before the
        rollout on the nodes inspect's plan lets the heavy checks run on (idle: jobs take precedence)."""
        sched = inspect_sb.slurm_states(self.state)
        plan = plan_sweep([(n.name, sched_state_of(sched.get(n.name)))
                           for n in inspect_sb.inspected_nodes(self.state)], "full")
        figures = inspect_sb.measure(self.state, plan.pairs, plan.unpaired)
        observed = []
        for name, mbps in figures.items():
            pool = self.pool_of.get(name, "sandbox")
            shape = self.pools.get(pool)
            if shape is not None:
                observed.append(InspectObservation(
                    node=name, pool=pool, sku=shape.sku, at=time.time(), expected_gpus=shape.gpus,
                    perf={inspect_sb.PERF_METRIC: mbps}))
        if self.gate_setup is None:
            return {}
        refs = pool_references(observed, self.gate_setup.thresholds)
        return {pool: dict(r) for pool, r in refs.items()}

    def health(self, nodes: Sequence[str]) -> dict[str, str]:
        """Nodes whose agent shows a fault (a held GPU fault, a driver load error) or did not answer
        AGENT_SILENT_READS reads in a row: node -> what. The rollout reads it for nodes it has not
        taken and for the current wave's."""
        out: dict[str, str] = {}
        for node in nodes:
            doc = self.agent_state(node)
            if doc is None:
                self._silent[node] = self._silent.get(node, 0) + 1
                if self._silent[node] >= AGENT_SILENT_READS:
                    out[node] = f"the node agent does not answer ({self._silent[node]} reads in a row)"
                continue
            self._silent.pop(node, None)
            fault = agent_fault(doc)
            if fault is not None:
                out[node] = fault
        return out

    def restart_missing_daemons(self, node: str) -> list[str]:
        """Start from their recipes the node's daemons that are not running (an interrupted reboot)."""
        self.state = read_state(self.stack, self.root)
        started, updated = [], {}
        for p in self.state.processes:
            if p.node == node and not alive(p.pid, p.start_time):
                popen, st = launch(Launch.model_validate(p.launch.model_dump()))
                if st is not None:
                    updated[p.name] = p.model_copy(update={"pid": popen.pid, "start_time": st})
                    started.append(p.name)
        if updated:
            self._save_processes(updated)
        return started
