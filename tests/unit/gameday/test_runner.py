"""The runner end to end against a stand-in `chaos` (fake_chaos.py replays recorded journals):
no sandbox is needed because the backend is not `sandbox` (no bring-up)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.gameday import GamedayOptions, Result, run_gameday
from gpufleet.gameday.report.summary import summary_dict
from gpufleet.gameday.runner import chaos_command, needs_fresh_training

HERE = Path(__file__).parent
EXPERIMENTS = HERE / "fixtures" / "experiments"
STACKS = HERE.parents[2] / "stacks"


STEADY = {"problems": [], "actions": [], "seconds": 0.0, "ok": True, "remaining": []}


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI runs the real steady-state check; there is no cluster behind the stand-in `chaos`."""
    monkeypatch.setattr("gpufleet.gameday.runner.ensure_steady_state", lambda _o, _l, _e=None: dict(STEADY))


def options(tmp_path: Path, *names: str, **kw: object) -> GamedayOptions:
    # Never the real `gpufleet chaos revert` from a unit test: it would touch the host's ledger.
    kw.setdefault("revert_argv", ("true",))
    # Nor the real steady-state check: there is no cluster behind the stand-in `chaos`.
    kw.setdefault("steady", lambda _o, _l, _e=None: dict(STEADY))
    return GamedayOptions(
        stack="sandbox", backend="slurm", experiments=names, report_dir=tmp_path / "report",
        experiments_dir=EXPERIMENTS, stacks_dir=STACKS, settle_s=0.0, **kw,  # type: ignore[arg-type]
    )


def test_runs_each_experiment_with_rollbacks_always(fake_chaos: Path, tmp_path: Path) -> None:
    run = run_gameday(options(tmp_path, "gpu-xid-79", "budget-breach"))
    assert [r.result for r in run.results] == [Result.MET, Result.MET]
    assert run.exit_code == 0
    argvs = [json.loads(line) for line in fake_chaos.read_text().splitlines()]
    assert len(argvs) == 2
    for argv, name in zip(argvs, ("gpu-xid-79", "budget-breach"), strict=True):
        assert argv[2:4] == ["run", "--rollback-strategy=always"]
        assert argv[-1] == str(EXPERIMENTS / f"{name}.json")
        at = argv.index("--var")
        assert argv[at:at + 2] == ["--var", "gpufleet_stack=sandbox"]
    # --stacks-dir reaches each run, which declares no gpufleet_stacks_dir of its own.
    stacks = Path(str(fake_chaos) + ".stacks_dir").read_text().splitlines()
    assert stacks == [str(options(tmp_path).stacks_dir.resolve())] * 2
    journal = tmp_path / "report" / "journals" / "gpu-xid-79.json"
    assert json.loads(journal.read_text())["status"] == "completed"
    assert run.results[0].journal == "journals/gpu-xid-79.json"


def test_each_experiment_starts_from_a_healed_steady_state(fake_chaos: Path, tmp_path: Path) -> None:
    """Healing is recorded beside the experiment that follows; an experiment whose healing failed
    is not run, is UNJUDGED with the reason, and the suite goes on."""
    reports = iter([
        {**STEADY, "problems": ["the training job runs on no node"], "actions": ["asked for a job"],
         "seconds": 12.5},
        {**STEADY, "problems": ["daemon slurmd@gpu-1 is not running"], "ok": False,
         "remaining": ["daemon slurmd@gpu-1 is not running"], "seconds": 150.0},
        dict(STEADY),
    ])
    run = run_gameday(options(tmp_path, "gpu-xid-79", "budget-breach", "gpu-xid-79",
                              steady=lambda _o, _l, _e=None: next(reports)))
    assert [r.result for r in run.results] == [Result.MET, Result.UNJUDGED, Result.MET]
    first, second, _ = run.results
    assert first.healing is not None and first.healing["actions"] == ["asked for a job"]
    assert second.notes[0] == ("not run: cluster not in steady state after 150.0 s of healing: "
                               "daemon slurmd@gpu-1 is not running")
    assert len(fake_chaos.read_text().splitlines()) == 2  # the unhealed one never ran
    summary = summary_dict(run)
    assert summary["experiments"][0]["healing"]["seconds"] == 12.5


def test_fresh_training_job_for_all_but_the_first_experiment_on_a_new_sandbox() -> None:
    """The Kubernetes sandbox's training Job is replaced before an experiment unless no fault can
    have touched it yet: the first experiment on a sandbox this game-day brought up."""
    assert not needs_fresh_training(0, brought_up=True)
    assert needs_fresh_training(0, brought_up=False)  # a sandbox that was up: its Job has a past
    assert needs_fresh_training(1, brought_up=True)
    assert needs_fresh_training(2, brought_up=False)


def test_var_only_for_declared_keys() -> None:
    from gpufleet.gameday.suite import Experiment

    exp = Experiment(name="e", path=Path("e.json"), title="t", tags=(),
                     configuration={"gpufleet_backend": "x"})
    opts = GamedayOptions(stack="s", backend="slurm", chaos_bin="chaos")
    cmd = chaos_command(opts, exp, Path("j"), Path("l"))
    assert cmd == ["chaos", "--log-file", "l", "run", "--rollback-strategy=always", "--journal-path", "j",
                   "--var", "gpufleet_backend=slurm", "e.json"]


def test_hung_experiment_is_stopped_with_rollbacks(
    fake_chaos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHAOS_MODE", "hang")
    run = run_gameday(options(tmp_path, "gpu-xid-79", experiment_timeout_s=1.0, rollback_grace_s=20.0))
    (r,) = run.results
    assert r.result is Result.UNJUDGED
    assert r.status == "interrupted"
    assert r.notes[0] == "timed out after 1 s and was stopped with SIGUSR1"
    assert run.exit_code == 3


def test_missing_journal_is_unjudged_and_reverted(
    fake_chaos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHAOS_MODE", "no-journal")
    marker = tmp_path / "reverted"
    (r,) = run_gameday(options(tmp_path, "gpu-xid-79", revert_argv=("touch", str(marker)))).results
    assert (r.result, r.status, r.journal) == (Result.UNJUDGED, "missing", None)
    assert r.notes[0].startswith("`chaos run` wrote no readable journal (exit 1)")
    assert r.notes[0].endswith(f"; `touch {marker}` restored the ledger's faults")
    assert marker.exists()


@pytest.mark.parametrize(
    ("names", "code"),
    [("gpu-xid-79,budget-breach", 0), ("gpu-xid-79,node-crash", 1), ("gpu-xid-79,inject-fails", 3)],
)
def test_cli_exit_codes_and_report(fake_chaos: Path, tmp_path: Path, names: str, code: int) -> None:
    report = tmp_path / "r"
    result = CliRunner().invoke(app, [
        "gameday", "--stack", "sandbox", "--backend", "slurm", "--experiments", names,
        "--experiments-dir", str(EXPERIMENTS), "--stacks-dir", str(STACKS), "--report", str(report),
    ])
    assert result.exit_code == code, result.output
    summary = json.loads((report / "summary.json").read_text())
    assert [e["name"] for e in summary["experiments"]] == names.split(",")
    assert summary["exit_code"] == code
    assert (report / "junit.xml").exists() and (report / "report.html").exists()
    assert "game-day sandbox (slurm)" in result.output


def test_cli_bad_input_exit_2(fake_chaos: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "gameday", "--stack", "sandbox", "--backend", "slurm", "--experiments", "nope",
        "--experiments-dir", str(EXPERIMENTS), "--stacks-dir", str(STACKS), "--report", str(tmp_path),
    ])
    assert result.exit_code == 2
    assert "nope: no experiment file nope.json" in result.output
    result = CliRunner().invoke(app, ["gameday", "--stack", "nosuch", "--stacks-dir", str(STACKS)])
    assert result.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the refusal for non-root users")
def test_cli_sandbox_needs_root(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["gameday", "--stack", "sandbox", "--stacks-dir", str(STACKS)])
    assert result.exit_code == 2
