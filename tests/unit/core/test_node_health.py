"""The node-health vocabulary (gpufleet.core.node_health) is what the platform really emits: the
messages match the generated node-problem-detector check, the condition and reasons its plugin
config, so the remediation and the chaos backend read and write what NPD writes on a real node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config import load_named_stack
from gpufleet.core.node_health import (
    CONDITION,
    HEALTHY_MESSAGE,
    HEALTHY_REASON,
    PROBLEM_REASON,
    CheckProblem,
    fabric_problem_message,
    parse_problem,
    xid_problem_message,
)
from gpufleet.infra.npd_check import render_script
from gpufleet.infra.self_healing import npd_plugin_config

REPO = Path(__file__).resolve().parents[3]


def test_the_plugin_config_sets_this_condition_with_these_reasons() -> None:
    cfg = npd_plugin_config(load_named_stack("sandbox", REPO / "stacks").slos)
    assert cfg["conditions"] == [{"type": CONDITION, "reason": HEALTHY_REASON, "message": HEALTHY_MESSAGE}]
    assert [(r["condition"], r["reason"]) for r in cfg["rules"]] == [(CONDITION, PROBLEM_REASON)]


def _run_check(tmp_path: Path, kmsg: str, port_state: str = "4: ACTIVE") -> str:
    table, _ = xid_policy(load_catalog(), {})
    tmp_path.mkdir()
    script = tmp_path / "check.sh"
    script.write_text(render_script(table))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dmesg").write_text(f"#!/bin/sh\nprintf '%s\\n' '{kmsg}'\n")
    (fake / "dmesg").chmod(0o755)
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(port_state + "\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "GPUFLEET_SYSFS": str(tmp_path / "sys")}
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, check=False)
    return out.stdout.strip()


@pytest.mark.skipif(not Path("/bin/sh").exists(), reason="needs a POSIX shell")
def test_the_messages_are_the_checks_own(tmp_path: Path) -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus"
    assert _run_check(tmp_path / "x", line) == xid_problem_message(79, "0000:3b:00")
    assert _run_check(tmp_path / "f", "", "1: DOWN") == fabric_problem_message(["mlx5_0/1"])


def test_parse_problem_reads_the_messages_back() -> None:
    assert parse_problem(xid_problem_message(79, "0000:3b:00")) == CheckProblem(xid=79)
    assert parse_problem(fabric_problem_message(["mlx5_0/1", "mlx5_1/1"])) == CheckProblem(
        fabric_ports=("mlx5_0/1", "mlx5_1/1"))
    assert parse_problem("UNKNOWN: cannot read the kernel log") == CheckProblem()
