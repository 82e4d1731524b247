"""The sandbox driver's commands and parsers (pure): what `gpufleet upgrade run` sends to Slurm and
the node agent's recipe, and how it reads squeue and sinfo back."""

from __future__ import annotations

import pytest

from gpufleet.core.maintenance import upgrade_reason
from gpufleet.core.sandbox_contract import Launch, SandboxNode, SandboxState
from gpufleet.core.slurm_state import NodeObs
from gpufleet.fleet.upgrade.model import Component
from gpufleet.fleet.upgrade.sandbox_ops import (
    cancel_argv,
    cordon_argv,
    cordoned_by,
    expand_hostlist,
    health_argv,
    parse_squeue,
    resume_argv,
    show_node_argv,
    slurmd_start_time,
    squeue_argv,
    upgraded_recipe,
    with_option,
)

PREFIX = ["ip", "netns", "exec", "gfr1-head", "env", "SLURM_CONF=/r/slurm.conf"]


def state() -> SandboxState:
    node = SandboxNode(name="gpu-1", role="compute", netns="gfr1-gpu-1", mgmt_ifname="mgmt0",
                       mgmt_peer="gr1m1", mgmt_address="10.77.0.11/24",
                       agent_socket="/r/nodes/gpu-1/agent.sock")
    return SandboxState(stack="sandbox", run_id="r1", phase="up", base_dir="/r", created_at=0.0,
                        head_netns="gfr1-head", slurm_conf="/r/slurm.conf", nodes=[node],
                        agent_token_file="/r/token")


def test_cordon_drains_with_the_rollout_mark_and_resume_returns() -> None:
    mark = upgrade_reason("sandbox-1", "driver", "570.124.06")
    assert cordon_argv(state(), "gpu-1", mark) == [
        *PREFIX, "scontrol", "update", "nodename=gpu-1", "state=DRAIN",
        "reason=gpufleet-upgrade sandbox-1: driver -> 570.124.06"]
    assert resume_argv(state(), "gpu-1") == [*PREFIX, "scontrol", "update", "nodename=gpu-1", "state=RESUME"]
    assert cancel_argv(state(), ("7", "9")) == [*PREFIX, "scancel", "7", "9"]
    assert squeue_argv(state())[-3:] == ["RUNNING,COMPLETING,CONFIGURING", "-o", "%i|%j|%P|%T|%N"]


@pytest.mark.parametrize(("text", "names"), [
    ("gpu-1", ["gpu-1"]),
    ("gpu-[0-1,3]", ["gpu-0", "gpu-1", "gpu-3"]),
    ("gpu-[0-1],spare-0", ["gpu-0", "gpu-1", "spare-0"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("", []),
])
def test_hostlists_expand_as_scontrol_show_hostnames(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


def test_squeue_lines_give_each_node_its_jobs() -> None:
    out = parse_squeue("12|llm-train|batch|RUNNING|gpu-[0-1]\n13|eval|prod|COMPLETING|gpu-1\n\ngarbage\n")
    assert {n: [j.id for j in js] for n, js in out.items()} == {"gpu-0": ["12"], "gpu-1": ["12", "13"]}
    assert out["gpu-1"][1].queue == "prod" and out["gpu-0"][0].name == "llm-train"


def test_the_reboot_recipe_changes_only_the_version() -> None:
    agent = Launch(program=["py", "-m", "gpufleet.sandbox.agent", "--node", "gpu-1", "--driver-version",
                            "550.90.07"], netns="gfr1-gpu-1", hostname="gpu-1", log="/r/agent.log")
    new = upgraded_recipe(agent, Component.DRIVER, "570.124.06")
    assert new.program[-2:] == ["--driver-version", "570.124.06"] and len(new.program) == len(agent.program)
    assert (new.netns, new.hostname, new.log) == (agent.netns, agent.hostname, agent.log)
    fw = upgraded_recipe(agent, Component.FIRMWARE, "96.00.9F.00.04")
    assert fw.program[-4:] == ["--driver-version", "550.90.07", "--firmware-version", "96.00.9F.00.04"]
    with pytest.raises(ValueError, match="no value"):
        with_option(["x", "--driver-version"], "--driver-version", "1")


def test_the_gate_runs_the_node_health_check_in_the_node_namespace_without_draining() -> None:
    agent = Launch(program=["py", "--xid-overrides", '{"79": {}}'], log="/r/a.log")
    st = state()
    argv = health_argv(st, st.node("gpu-1"), agent, python="/venv/python")
    assert argv[:6] == ["ip", "netns", "exec", "gfr1-gpu-1", "/venv/python", "-m"]
    assert "--slurm-drain" not in argv
    assert argv[argv.index("--agent-socket") + 1] == "/r/nodes/gpu-1/agent.sock"
    assert argv[argv.index("--xid-overrides") + 1] == '{"79": {}}'


def test_who_cordoned_a_node_comes_from_sinfo() -> None:
    ok = NodeObs("gpu-0", "idle", "", None, True)
    drained = NodeObs("gpu-1", "drained", "alice: bad fan", None, False)
    down = NodeObs("gpu-2", "down*", "", None, False)
    assert cordoned_by(ok, frozenset()) is None
    assert cordoned_by(drained, frozenset()) == "alice: bad fan"
    assert cordoned_by(down, frozenset()) == "down*"
    assert cordoned_by(None, frozenset()) == "not known to Slurm"


def test_a_restarted_slurmd_has_registered_once_its_start_time_is_later() -> None:
    assert show_node_argv(state(), "gpu-1")[-5:] == ["scontrol", "-o", "show", "node", "gpu-1"]
    line = ("NodeName=gpu-1 Arch=x86_64 CoresPerSocket=1 BootTime=2026-12-01T08:00:00 "
            "SlurmdStartTime=2026-12-05T02:07:31 LastBusyTime=2026-12-05T02:07:30 State=IDLE+DRAIN")
    import time
    want = time.mktime(time.strptime("2026-12-05T02:07:31", "%Y-%m-%dT%H:%M:%S"))
    assert slurmd_start_time(line) == want
    assert slurmd_start_time("NodeName=gpu-1 SlurmdStartTime=None") is None
    assert slurmd_start_time("NodeName=gpu-1") is None
