"""End-to-end chaos experiment on the Slurm sandbox (issue 16): a GPU fault (XID 79, the catalog's
`gpu-xid-79`, injected by the chaos extension's own action) on the node a rolling upgrade holds is
handled by exactly one actor, the rollout: its gate fails on the fault, it rolls the node back, halts
and holds the node; the sandbox's remediation (the periodic `node-health --slurm-drain` and the job
Epilog, ADR 0051) sees the fault, stands aside and logs it, and never drains the node. The same fault
on a node no rollout holds is drained by remediation alone.

The evidence is Slurm's own: slurmctld logs every reason set on a node (`update_node: node N reason
set to: ...`), so who drained a node is read from the controller, not from the actors' reports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import GPUFLEET, REPO, gpufleet, wait_until

from gpufleet.chaos.settings import RUN_KEY
from gpufleet.core.agent_client import AgentError, agent_state
from gpufleet.core.maintenance import UPGRADE_MARK
from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.core.slurm_state import SINFO_ARGS, parse_sinfo
from gpufleet.fleet.upgrade.sandbox_driver import CordonRecord, record_path
from gpufleet.fleet.upgrade.sandbox_ops import show_node_argv
from gpufleet.fleet.upgrade.slurm_driver import REBOOTING, parse_show_node

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
pytestmark = [pytest.mark.sandbox, needs_root, pytest.mark.timeout(1500)]

STACK = "sandbox"
NEW = "570.124.06"
REMEDIATION_REASON = "gpufleet: GPU has fallen off the bus (gpu-xid-79"  # health.decide.drain_reason
CONFIG = {"gpufleet_backend": "sandbox", "gpufleet_stack": STACK}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("one-actor-root")
    res = gpufleet(root, "sandbox", "up", "--stack", STACK, timeout=600)
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        yield root
    finally:
        gpufleet(root, "sandbox", "down", "--stack", STACK, "--keep-files", timeout=300)


@pytest.fixture(autouse=True)
def _a_run_per_test() -> Iterator[None]:
    """The first action of a test names its ad-hoc chaos run in CONFIG; the conftest ends that run
    after the test, so the next test must not find its id there."""
    yield
    CONFIG.pop(RUN_KEY, None)


def reasons_set(state: SandboxState, node: str, since: str) -> list[str]:
    """Every drain reason slurmctld set on `node` from the timestamp `since` (its log's format)."""
    log = Path(state.base_dir) / "slurm" / "slurmctld.log"
    pat = re.compile(rf"^\[(\S+)\] update_node: node {re.escape(node)} reason set to: (.*)$")
    return [m.group(2) for line in log.read_text().splitlines()
            if (m := pat.match(line)) and m.group(1) >= since]


def node_reason(state: SandboxState, node: str) -> str:
    res = subprocess.run(state.slurm_command(*SINFO_ARGS), capture_output=True, text=True, timeout=30)
    obs = parse_sinfo(res.stdout).get(node)
    return obs.reason if obs else ""


def schedulable(state: SandboxState, node: str) -> bool:
    res = subprocess.run(state.slurm_command(*SINFO_ARGS), capture_output=True, text=True, timeout=30)
    obs = parse_sinfo(res.stdout).get(node)
    return obs is not None and obs.schedulable


def agent_version(state: SandboxState, node: str) -> str | None:
    n = next(x for x in state.nodes if x.name == node)
    try:
        token = Path(state.agent_token_file or "").read_text().strip()
        doc = agent_state(Path(n.agent_socket or ""), token, 2.0)
    except (AgentError, OSError):
        return None  # restarting (the socket is gone or refuses): polled again
    return str(doc.get("driver_version"))


def reboot_complete(state: SandboxState, node: str) -> bool:
    """Slurm has the node back from its reboot: no reboot flag, responding (the rollout's own test,
    slurm_driver.reboot_progress, also compares the boot time with its request)."""
    res = subprocess.run(show_node_argv(state, node), capture_output=True, text=True, timeout=30)
    view = parse_show_node(res.stdout)
    return res.returncode == 0 and not view.flags & (REBOOTING | {"NOT_RESPONDING"})


def stood_aside_lines(state: SandboxState, node: str) -> list[str]:
    d = Path(state.base_dir) / "nodes" / node
    lines: list[str] = []
    for name in ("healthcheck.log", "epilog.log"):
        p = d / name
        if p.exists():
            lines += [ln for ln in p.read_text().splitlines() if "stood aside" in ln]
    return lines


def slurm_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


def upgrade_with_a_fault_before_the_gate(root: Path, state: SandboxState, report: Path, fault_id: str,
                                         gpu: int) -> tuple[int, str, str]:
    """Run `gpufleet upgrade run` and inject the catalog fault `fault_id` on the canary (the idlest
    node: no drain to wait for) once it is back at the new version, still under upgrade (the
    rollout's mark is its reason) and its reboot is complete in Slurm's view (registered, no reboot
    flag): the fault lands between the reboot and the gate. (A fault injected before the reboot is
    the agent's to keep, but under load the drain of a busy node can outlast drainTimeoutSeconds, and
    the node is then handed back. One injected after the agent was back but before slurmd had
    registered failed slurmd's start-up health check, and slurmctld never completed the reboot: the
    rollout timed out on the reboot, not the gate.) Returns the rollout's exit code, its output and
    the node."""
    from gpufleet.chaos.gpu.actions import inject_gpu_fault

    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root)}
    argv = [GPUFLEET, "upgrade", "run", "--stack", STACK, "--to", NEW, "--report", str(report)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    rec = record_path(STACK, root)
    try:
        def rebooted_under_upgrade() -> str | None:
            for n in CordonRecord.load(rec).open_nodes():
                if agent_version(state, n) == NEW and node_reason(state, n).startswith(UPGRADE_MARK + " ") \
                        and reboot_complete(state, n):
                    return n
            return None

        node = wait_until("a node rebooted into the new version, still under upgrade", rebooted_under_upgrade,
                          600, 0.05)
        print("injected:", inject_gpu_fault(fault_id, node, gpu=gpu, configuration=CONFIG))
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(out)
    return proc.returncode, out, node


def test_a_gpu_fault_on_the_node_under_upgrade_is_handled_by_the_rollout_alone(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.chaos.gpu.actions import clear_gpu_faults, inject_gpu_fault

    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("GPUFLEET_LEDGER", str(root / "ledger.jsonl"))
    state = read_state(STACK, root)
    report = tmp_path / "rollout.json"
    since = slurm_now()
    rec = record_path(STACK, root)
    rc, out, node = upgrade_with_a_fault_before_the_gate(root, state, report, "gpu-xid-79", 3)
    # The rollout handled it: the gate failed on the XID, the node was rolled back and, its gate
    # failing again on the same held fault, held drained for people; the rollout halted at the canary.
    assert rc == 1, out
    doc = json.loads(report.read_text())
    gates = [e for e in doc["log"] if e["node"] == node and e["action"].startswith("gate")]
    assert gates and all(e["action"] == "gate FAILED" for e in gates), gates
    assert any("79" in e["detail"] for e in gates), gates
    assert [e["action"] for e in doc["log"] if e["node"] == node].count("reboot") == 2  # up, then back
    assert doc["haltedBy"] and node in doc["haltedBy"]
    assert [e["node"] for e in doc["log"] if e["action"] == "cordon"] == [node]  # halted at the canary
    # Remediation saw the fault (its periodic check runs every few seconds) and stood aside.
    wait_until("remediation logs that it stood aside", lambda: stood_aside_lines(state, node), 90)
    time.sleep(10)  # several more periodic checks: none may drain the node
    reasons = reasons_set(state, node, since)
    print(f"reasons set on {node}: {reasons}")
    print(f"remediation on {node}: {stood_aside_lines(state, node)[:3]}")
    assert not any(r.startswith(REMEDIATION_REASON) for r in reasons), reasons
    assert all(r.startswith(UPGRADE_MARK) for r in reasons), reasons  # only the rollout's reasons
    assert node_reason(state, node).startswith(f"{UPGRADE_MARK}-failed: ")

    # The same fault on a node no rollout holds: remediation drains it, alone. The first fault is
    # undone first (the chaos ledger's rollback: GPU clear and resume), so that the blast-radius guard
    # (one spare in the sandbox stack) lets the second in.
    # The chaos rollback clears the GPU and resumes the node; the guard counts every unschedulable
    # node as down, and a node whose slurmd was restarted (the rollback's reboot) can show not
    # responding for a ping of slurmctld: wait until it is schedulable again.
    print(clear_gpu_faults(node=node, configuration=CONFIG))
    wait_until("the held node back in service", lambda: schedulable(state, node), 120)
    others = [n.name for n in state.nodes if n.role in ("compute", "spare") and n.name != node]
    other = others[-1]
    since = slurm_now()
    inject_gpu_fault("gpu-xid-79", other, gpu=3, configuration=CONFIG)
    wait_until("remediation drains the node",
               lambda: node_reason(state, other).startswith(REMEDIATION_REASON), 120)
    reasons = reasons_set(state, other, since)
    print(f"reasons set on {other}: {reasons}")
    assert reasons and all(r.startswith(REMEDIATION_REASON) for r in reasons), reasons
    assert not stood_aside_lines(state, other)
    assert other not in CordonRecord.load(rec).nodes

    # Clean up: the chaos ledger's rollback clears the GPUs and returns the drained nodes.
    print(clear_gpu_faults(configuration=CONFIG))


def test_a_gpu_hang_on_the_node_under_upgrade_is_caught_by_the_smoke_run_alone(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung GPU reports nothing (no XID, no DCGM field: ADR 0055), so node-health and inspect pass
    the node; the gate's one-step training smoke run blocks on the GPU and fails at its deadline
    (ADR 0067). The rollout rolls the node back, halts at the canary and holds it."""
    from gpufleet.chaos.gpu.actions import clear_gpu_faults
    from gpufleet.fleet.upgrade.sandbox_ops import SMOKE_DEADLINE_S

    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("GPUFLEET_LEDGER", str(root / "ledger.jsonl"))
    state = read_state(STACK, root)
    wait_until("every node schedulable", lambda: all(
        schedulable(state, n.name) for n in state.nodes if n.role in ("compute", "spare")), 120)
    report = tmp_path / "rollout.json"
    rc, out, node = upgrade_with_a_fault_before_the_gate(root, state, report, "gpu-hang", 0)
    try:
        assert rc == 1, out
        doc = json.loads(report.read_text())
        gates = [e for e in doc["log"] if e["node"] == node and e["action"].startswith("gate")]
        assert gates and all(e["action"] == "gate FAILED" for e in gates), gates
        # Everything before the smoke run passed the hung node; the smoke run failed at its deadline.
        first = gates[0]["detail"]
        assert "node-health ok; inspect full ok" in first, first
        assert f"rank 0 did not finish within {SMOKE_DEADLINE_S:g} s" in first, first
        assert [e["node"] for e in doc["log"] if e["action"] == "cordon"] == [node]  # halted at the canary
        assert node_reason(state, node).startswith(f"{UPGRADE_MARK}-failed: ")
        assert not list((Path(state.base_dir) / "nodes" / node / "procs").glob("gpu*.json"))  # GPUs released
    finally:
        print(clear_gpu_faults(configuration=CONFIG))
