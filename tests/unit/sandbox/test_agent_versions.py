"""The node agent's driver and firmware versions: options, GET /state keys, a bad version's error."""

from __future__ import annotations

from pathlib import Path

from gpufleet.catalog import load_catalog
from gpufleet.config import load_named_stack
from gpufleet.sandbox.agent.cli import build_parser
from gpufleet.sandbox.agent.runtime import Agent, Versions
from gpufleet.sandbox.agents import agent_argv, version_options
from gpufleet.sandbox.layout import plan_layout


def _agent(tmp_path: Path, versions: Versions) -> Agent:
    return Agent(node="gpu-0", gpus=2, model_name="NVIDIA H100 80GB HBM3", state_dir=tmp_path / "s",
                 kernel_log=tmp_path / "kern.log", fabric_ifnames=[], catalog=load_catalog(),
                 versions=versions)


def test_state_doc_reports_versions_and_no_error(tmp_path: Path) -> None:
    doc = _agent(tmp_path, Versions("550.90.07", "96.00.89.00.01", frozenset({"560.0.0-bad"}))).state_doc()
    assert (doc["driver_version"], doc["firmware_version"], doc["driver_error"]) == (
        "550.90.07", "96.00.89.00.01", None)


def test_a_bad_version_reports_a_load_error(tmp_path: Path) -> None:
    doc = _agent(tmp_path, Versions("560.0.0-bad", None, frozenset({"560.0.0-bad"}))).state_doc()
    assert doc["driver_version"] == "560.0.0-bad"
    assert doc["driver_error"] == "driver 560.0.0-bad failed to initialize the GPUs"


def test_unpinned_versions_are_null(tmp_path: Path) -> None:
    doc = _agent(tmp_path, Versions()).state_doc()
    assert doc["driver_version"] is None and doc["firmware_version"] is None


def test_version_options_round_trip_through_the_agent_parser() -> None:
    opts = version_options("550.90.07", "96.00.89.00.01", ["a-bad", "b-bad"])
    args = build_parser().parse_args(["--node", "n", "--listen", "127.0.0.1:0", "--control-socket", "s",
                                      "--token-file", "t", "--state-dir", "d", "--kernel-log", "k", *opts])
    assert (args.driver_version, args.firmware_version, args.bad_versions) == (
        "550.90.07", "96.00.89.00.01", "a-bad,b-bad")
    assert version_options(None, None, []) == []


def test_the_sandbox_stack_pins_reach_the_agent_recipe() -> None:
    spec = load_named_stack("sandbox", Path("stacks"))
    layout = plan_layout("sandbox", spec, "a1b2c3", Path("/r/run-a1b2c3"))
    argv = agent_argv(layout, layout.nodes[0].name)
    assert argv[argv.index("--driver-version") + 1] == spec.node_pools[0].software.driver == "550.90.07"
    assert argv[argv.index("--firmware-version") + 1] == "96.00.89.00.01"
    assert argv[argv.index("--bad-versions") + 1] == "560.0.0-bad"
