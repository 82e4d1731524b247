"""The state file during `up` and the cleanup `down` plans from it (gpufleet.sandbox.state/down)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.core.sandbox_contract import Launch, SandboxNode, SandboxProcess, SandboxState, read_state
from gpufleet.sandbox.down import all_stacks, plan_cleanup
from gpufleet.sandbox.state import Recorder, existing, new_state

_L = Launch(program=["true"], log="/dev/null")


def test_recorder_writes_every_change_at_once(tmp_path: Path) -> None:
    rec = Recorder(new_state("s1", "abc123", tmp_path / "s1" / "run-abc123"), tmp_path)
    assert read_state("s1", tmp_path).phase == "creating"  # written before anything is created
    rec.add_names("namespaces", ["gf-abc123-head", "gf-abc123-gpu-0"])
    rec.add_names("namespaces", ["gf-abc123-gpu-0", "gf-abc123-gpu-1"])  # no duplicates
    assert read_state("s1", tmp_path).namespaces == ["gf-abc123-head", "gf-abc123-gpu-0", "gf-abc123-gpu-1"]
    rec.add_process(SandboxProcess(name="munged", pid=10, start_time=99, launch=_L))
    rec.update(phase="up", prometheus_url="http://127.0.0.1:1234")
    st = read_state("s1", tmp_path)
    assert (st.phase, st.prometheus_url, st.processes[0].name) == ("up", "http://127.0.0.1:1234", "munged")


def test_recorder_rejects_invalid_updates(tmp_path: Path) -> None:
    rec = Recorder(new_state("s1", "abc123", tmp_path), tmp_path)
    try:
        rec.update(phase="flying")
    except ValueError:
        pass
    else:
        raise AssertionError("an invalid phase was accepted")
    assert read_state("s1", tmp_path).phase == "creating"


def test_existing_reports_absent_present_and_unreadable(tmp_path: Path) -> None:
    assert existing("s1", tmp_path).state is None and existing("s1", tmp_path).error is None
    Recorder(new_state("s1", "abc123", tmp_path), tmp_path)
    assert existing("s1", tmp_path).state is not None
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "state.json").write_text("{not json")
    bad = existing("s2", tmp_path)
    assert bad.state is None and bad.error is not None and "s2/state.json" in bad.error
    assert all_stacks(tmp_path) == ["s1", "s2"]


def test_a_state_file_of_another_version_is_refused_naming_both(tmp_path: Path) -> None:
    Recorder(new_state("s1", "abc123", tmp_path), tmp_path)
    path = tmp_path / "s1" / "state.json"
    path.write_text(path.read_text().replace('"version": 2', '"version": 1'))
    bad = existing("s1", tmp_path)
    assert bad.state is None and bad.error is not None
    assert "version 1" in bad.error and "reads version 2" in bad.error and "sandbox down" in bad.error


def _crashed_state() -> SandboxState:
    """As left by `kill -9` of `up` after the network and two daemons: nodes recorded, some
    namespaces recorded, the controller not yet."""
    return SandboxState(
        stack="s",
        run_id="abc123",
        phase="creating",
        base_dir="/r/s/run-abc123",
        created_at=0.0,
        head_netns="gf-abc123-head",
        namespaces=["gf-abc123-head", "gf-abc123-gpu-0"],
        bridges=["gfabc123m", "gfabc123f0"],
        links=["gfabc123h", "gfabc123m0", "gfabc123f0.0"],
        mounts=["/r/s/run-abc123/a", "/r/s/run-abc123/a/b"],
        nodes=[
            SandboxNode(
                name="gpu-1",
                role="compute",
                netns="gf-abc123-gpu-1",
                mgmt_ifname="mgmt0",
                mgmt_peer="gfabc123m1",
                mgmt_address="10.77.0.11/24",
            ),
        ],
        processes=[
            SandboxProcess(name="munged", pid=100, start_time=5, launch=_L),
            SandboxProcess(name="prometheus", pid=101, start_time=6, netns="gf-abc123-head", launch=_L),
            SandboxProcess(name="slurmctld", pid=102, start_time=7, netns="gf-abc123-head", launch=_L),
        ],
    )


def test_cleanup_plan_covers_everything_recorded_and_orders_it() -> None:
    plan = plan_cleanup(_crashed_state())
    # Last started first: slurmctld stops before munged, which it needs.
    assert [p[0] for p in plan.processes] == ["slurmctld", "prometheus", "munged"]
    assert plan.processes[0] == ("slurmctld", 102, 7)
    # A node recorded before its namespace was listed is still covered.
    assert plan.namespaces == ("gf-abc123-head", "gf-abc123-gpu-0", "gf-abc123-gpu-1")
    assert plan.bridges == ("gfabc123m", "gfabc123f0")
    assert plan.links == ("gfabc123h", "gfabc123m0", "gfabc123f0.0")
    assert plan.mounts == ("/r/s/run-abc123/a/b", "/r/s/run-abc123/a")  # innermost first
    assert plan.base_dir == "/r/s/run-abc123"


def test_cleanup_plan_of_an_empty_state_is_empty() -> None:
    st = SandboxState(stack="s", run_id="abc123", phase="creating", base_dir="/r", created_at=0.0)
    plan = plan_cleanup(st)
    assert (plan.processes, plan.namespaces, plan.bridges, plan.links, plan.mounts) == ((), (), (), (), ())
