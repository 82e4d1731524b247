"""`gpufleet upgrade run`: bad input is exit 2 with what is wrong (no sandbox, no target, an earlier
run's cordons not cleaned up), and the cordon record an interrupted run leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpufleet.cli.main import app
from gpufleet.core.sandbox_contract import SandboxState, write_state
from gpufleet.fleet.upgrade.sandbox_driver import CordonRecord, record_path

STACKS = Path(__file__).parents[3] / "stacks"
runner = CliRunner()


def run(root: Path, *args: str) -> Result:
    result = runner.invoke(app, ["upgrade", "run", "--stacks-dir", str(STACKS), "--state-root", str(root),
                                 "--stack", "sandbox", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def test_no_running_sandbox_is_bad_input(tmp_path: Path) -> None:
    res = run(tmp_path, "--to", "570.124.06")
    assert res.exit_code == 2 and "no running sandbox to upgrade" in " ".join(res.output.split())


def test_a_bad_version_string_is_refused(tmp_path: Path) -> None:
    res = run(tmp_path, "--to", "-x")
    assert res.exit_code == 2 and "is not a version" in res.output


@pytest.fixture
def up(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("t\n")
    write_state(SandboxState(stack="sandbox", run_id="r1", phase="up", base_dir=str(tmp_path), created_at=0.0,
                             agent_token_file=str(token)), tmp_path)
    return tmp_path


def test_without_a_target_or_cleanup_it_says_what_is_missing(up: Path) -> None:
    res = run(up)
    assert res.exit_code == 2 and "a target version is needed" in res.output


def test_an_earlier_runs_cordons_must_be_cleaned_up_first(up: Path) -> None:
    rec = CordonRecord(record_path("sandbox", up), "sandbox-1", "gpufleet-upgrade sandbox-1: driver -> 2",
                       {"gpu-1": "cordoned", "gpu-2": "held"})
    rec.save()
    res = run(up, "--to", "570.124.06")
    assert res.exit_code == 2 and "left gpu-1 cordoned" in " ".join(res.output.split())
    back = CordonRecord.load(rec.path)
    assert back.open_nodes() == ["gpu-1"] and back.mark == rec.mark
    assert json.loads(rec.path.read_text())["nodes"] == {"gpu-1": "cordoned", "gpu-2": "held"}


def test_a_node_is_on_record_before_it_is_drained_and_off_it_once_resumed(up: Path) -> None:
    import subprocess

    from gpufleet.fleet.upgrade.model import Component
    from gpufleet.fleet.upgrade.sandbox_driver import SandboxDriver

    seen: list[tuple[str, list[str]]] = []
    mark = "gpufleet-upgrade r: driver -> 2"

    def runner_(argv: object) -> subprocess.CompletedProcess[str]:
        args = list(argv)  # type: ignore[call-overload]
        seen.append((" ".join(args[-4:]), CordonRecord.load(record_path("sandbox", up)).open_nodes()))
        out = f"gpu-1|drained|{mark}|Unknown\n" if "sinfo" in args else ""
        return subprocess.CompletedProcess(args, 0, out, "")

    d = SandboxDriver("sandbox", Component.DRIVER, up, runner=runner_)
    d.state = d.state.model_copy(update={"head_netns": "h", "slurm_conf": "/s.conf"})
    d.record.mark = mark
    d.cordon("gpu-1", mark)
    assert seen[-1] == (f"update nodename=gpu-1 state=DRAIN reason={mark}", ["gpu-1"])
    assert d.uncordon("gpu-1")
    assert seen[-1][0] == "scontrol update nodename=gpu-1 state=RESUME"
    assert CordonRecord.load(record_path("sandbox", up)).open_nodes() == []
