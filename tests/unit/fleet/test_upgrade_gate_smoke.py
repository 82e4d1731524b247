"""The upgrade gate's last step, the one-step training smoke run: the driver runs it in the node's
namespace only after node-health and inspect passed, a failed smoke run fails the gate with its
reason, and the smoke run's answer is read strictly (no JSON, a non-zero exit: failed)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.sandbox_contract import Launch, SandboxNode, SandboxProcess, SandboxState, write_state
from gpufleet.fleet.inspect.checks import Pins
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs
from gpufleet.fleet.inspect.thresholds import load_thresholds
from gpufleet.fleet.upgrade.gate import GateSetup
from gpufleet.fleet.upgrade.model import Component
from gpufleet.fleet.upgrade.sandbox_driver import SandboxDriver
from gpufleet.fleet.upgrade.sandbox_ops import SMOKE_DEADLINE_S, smoke_argv, smoke_result

NEW = "570.124.06"
CAT = load_catalog()
RULES, _ = xid_policy(CAT, {})
SETUP = GateSetup(level="light", floor_percent=90.0, thresholds=load_thresholds(), xid_rules=RULES,
                  component=Component.DRIVER, pins={"sandbox": Pins(driver="550.90.07")},
                  fault_actions={f.id: f.action for f in CAT}, smoke_ranks=2)
NODE = SandboxNode(name="gpu-2", role="compute", netns="r1-gpu-2", mgmt_ifname="m0", mgmt_peer="p2",
                   mgmt_address="10.0.0.3/24", gpus=4, agent_socket="/run/a.sock")


@pytest.fixture
def state(tmp_path: Path) -> SandboxState:
    token = tmp_path / "token"
    token.write_text("t\n")
    agent = SandboxProcess(name="agent@gpu-2", pid=1, start_time=1, node="gpu-2",
                           launch=Launch(program=["python", "-m", "agent"], log="/dev/null"))
    st = SandboxState(stack="sandbox", run_id="r1", phase="up", base_dir=str(tmp_path), created_at=0.0,
                      agent_token_file=str(token), head_netns="h", slurm_conf="/s.conf", nodes=[NODE],
                      processes=[agent], training_hosts_file=str(tmp_path / "hosts.json"))
    write_state(st, tmp_path)
    return st


def test_the_smoke_argv_runs_the_jobs_ranks_in_the_nodes_namespace(state: SandboxState) -> None:
    argv = smoke_argv(state, NODE, 2, python="/venv/bin/python")
    assert argv[:6] == ["ip", "netns", "exec", "r1-gpu-2", "/venv/bin/python", "-m"]
    assert argv[6] == "gpufleet.sandbox.training.smoke"
    flags = dict(zip(argv[7::2], argv[8::2], strict=True))
    assert flags == {"--node": "gpu-2", "--ranks": "2", "--gpus": "4", "--base-dir": state.base_dir,
                     "--hosts-file": state.training_hosts_file, "--deadline": f"{SMOKE_DEADLINE_S:g}"}
    with pytest.raises(ValueError, match="no training hosts file"):
        smoke_argv(state.model_copy(update={"training_hosts_file": None}), NODE, 2)


def test_the_smoke_deadline_is_inside_the_drivers_command_timeout() -> None:
    from gpufleet.fleet.upgrade.sandbox_driver import COMMAND_TIMEOUT_S

    assert SMOKE_DEADLINE_S + 8 <= COMMAND_TIMEOUT_S  # + the ranks' stop, Python's start and the judging


@pytest.mark.parametrize(("rc", "out", "err", "passed", "says"), [
    (0, json.dumps({"passed": True, "detail": "smoke run ok", "seconds": 4.2}), "", True,
     "smoke run ok in 4.2 s"),
    (1, json.dumps({"passed": False, "detail": "smoke run failed: rank 0 exited 1", "seconds": 3}), "", False,
     "rank 0 exited 1"),
    (0, "", "Traceback ...\nImportError: torch", False, "smoke run rc 0: Traceback"),
    (2, "", "smoke: /x: no hosts file", False, "smoke run rc 2: smoke: /x: no hosts file"),
    (1, json.dumps({"passed": True, "detail": "?"}), "", False, "?"),  # rc wins over the document
])
def test_the_smoke_answer_is_read_strictly(rc: int, out: str, err: str, passed: bool, says: str) -> None:
    got, detail = smoke_result(rc, out, err)
    assert got is passed
    assert says in detail


class Runner:
    """node-health passes; the smoke run answers `smoke` (None: it times out)."""

    def __init__(self, smoke: subprocess.CompletedProcess[str] | None) -> None:
        self.smoke, self.calls = smoke, []  # type: list[list[str]]

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if "gpufleet.sandbox.training.smoke" in argv:
            if self.smoke is None:
                raise subprocess.TimeoutExpired(list(argv), 30.0)
            return self.smoke
        return subprocess.CompletedProcess(list(argv), 0, "{}", "")

    def smoke_calls(self) -> int:
        return sum("gpufleet.sandbox.training.smoke" in c for c in self.calls)


def observation(**kw: Any) -> NodeObservation:
    base: dict[str, Any] = dict(
        node="gpu-2", pool="sandbox", sku=AcceleratorModel.H100_SXM, at=1.0, expected_gpus=4,
        sched_state="drained", gpus=tuple(GpuObs(index=i) for i in range(4)),
        ports=(PortObs(name="fab0", state="up", speed_gbps=100.0),), expected_port_gbps=100.0,
        driver_version=NEW)
    return NodeObservation(**{**base, **kw})


def driver(state: SandboxState, runner: Runner, monkeypatch: pytest.MonkeyPatch, setup: GateSetup,
           obs: NodeObservation) -> SandboxDriver:
    d = SandboxDriver("sandbox", Component.DRIVER, Path(state.base_dir), runner=runner, gate_setup=setup)
    monkeypatch.setattr(d, "agent_state", lambda node: {"driver_version": NEW})
    monkeypatch.setattr(d, "inspect_observation", lambda node, doc: obs)
    return d


def answer(passed: bool, detail: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], 0 if passed else 1,
                                       json.dumps({"passed": passed, "detail": detail, "seconds": 5.0}), "")


def test_a_passed_inspect_then_a_passed_smoke_run_pass_the_gate(state: SandboxState,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    r = Runner(answer(True, "smoke run ok: 2 rank(s), step 1 loss 0.8, checkpoint verified"))
    passed, detail = driver(state, r, monkeypatch, SETUP, observation()).gate("gpu-2", NEW)
    assert passed, detail
    assert detail.startswith("node-health ok; inspect light ok; smoke run ok: 2 rank(s)")
    assert r.smoke_calls() == 1


def test_a_failed_smoke_run_fails_the_gate_with_its_reason(state: SandboxState,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    r = Runner(answer(False, "smoke run failed: rank 0 did not finish within 20 s"))
    passed, detail = driver(state, r, monkeypatch, SETUP, observation()).gate("gpu-2", NEW)
    assert not passed
    assert "rank 0 did not finish within 20 s" in detail


def test_a_smoke_run_past_the_command_timeout_fails_the_gate(state: SandboxState,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    passed, detail = driver(state, Runner(None), monkeypatch, SETUP, observation()).gate("gpu-2", NEW)
    assert not passed and detail.endswith("the smoke run did not answer in time")


def test_a_state_without_the_hosts_file_fails_the_gate_saying_so(state: SandboxState,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = driver(state, Runner(answer(True, "smoke run ok")), monkeypatch, SETUP, observation())
    d.state = d.state.model_copy(update={"training_hosts_file": None})
    passed, detail = d.gate("gpu-2", NEW)
    assert not passed and "no smoke run: sandbox sandbox has no training hosts file" in detail


def test_no_smoke_run_after_a_failed_inspect_or_when_it_is_off(state: SandboxState,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    r = Runner(answer(True, "smoke run ok"))
    bad = observation(gpus=tuple(GpuObs(index=i) for i in range(3)))  # a GPU fell off the bus
    passed, _ = driver(state, r, monkeypatch, SETUP, bad).gate("gpu-2", NEW)
    assert not passed and r.smoke_calls() == 0
    off = replace(SETUP, smoke_ranks=0)
    passed, detail = driver(state, r, monkeypatch, off, observation()).gate("gpu-2", NEW)
    assert passed and "smoke" not in detail and r.smoke_calls() == 0
