"""Dry-run, settings validation and the control's signal handling."""

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import InvalidActivity

from gpufleet.chaos import control, engine
from gpufleet.chaos.gpu import actions as gpu_actions
from gpufleet.chaos.ledger import FaultRecord, Ledger, Rollback
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.chaos.settings import parse_settings
from gpufleet.core.sandbox_contract import SandboxNode, SandboxState, write_state


def test_settings_reject_bad_values_all_at_once() -> None:
    with pytest.raises(InvalidActivity) as e:
        parse_settings(
            {
                "gpufleet_backend": "nomad",
                "gpufleet_dry_run": "maybe",
                "gpufleet_budget_override": {"detect": 1},
            }
        )
    msg = str(e.value)
    assert "gpufleet_backend" in msg and "gpufleet_dry_run" in msg and "gpufleet_budget_override" in msg


def test_configured_zero_is_not_replaced_by_a_default() -> None:
    """A zero budget is refused at the edge with its key (one parser, gpufleet.slo), never
    replaced by the stack's value."""
    with pytest.raises(InvalidActivity, match=r"gpufleet_budget_override.detect_seconds must be positive"):
        parse_settings({"gpufleet_budget_override": {"detect_seconds": 0, "recover_seconds": 5}})


def test_stacks_folder_from_the_configuration_else_the_game_days_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUFLEET_STACKS_DIR", raising=False)
    assert parse_settings({}).stacks_dir == Path("stacks")
    monkeypatch.setenv("GPUFLEET_STACKS_DIR", "/srv/stacks")
    assert parse_settings({}).stacks_dir == Path("/srv/stacks")
    assert parse_settings({"gpufleet_stacks_dir": "mine"}).stacks_dir == Path("mine")


def test_budget_override_takes_both_key_styles() -> None:
    s = parse_settings({"gpufleet_budget_override": {"detectSeconds": 1, "recover_seconds": 5}})
    assert s.budget_override == {"detect_seconds": 1.0, "recover_seconds": 5.0}


def _sandbox_state(root: Path) -> None:
    write_state(
        SandboxState(
            stack="sandbox",
            run_id="t1",
            phase="up",
            base_dir=str(root / "run"),
            created_at=0.0,
            nodes=[
                SandboxNode(
                    name="gpu-0",
                    role="compute",
                    netns="t1-gpu-0",
                    mgmt_ifname="m0",
                    mgmt_peer="p0",
                    mgmt_address="10.0.0.2/24",
                    gpus=8,
                    agent_socket=str(root / "missing.sock"),
                )
            ],
            agent_token_file=None,
        ),
        root,
    )


def test_dry_run_records_and_prints_but_applies_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _sandbox_state(tmp_path)
    cfg = {
        "gpufleet_backend": "sandbox",
        "gpufleet_stack": "sandbox",
        "gpufleet_dry_run": True,
        "gpufleet_sandbox_root": str(tmp_path),
        "gpufleet_stacks_dir": str(Path(__file__).parents[3] / "stacks"),
    }
    # XID 45 is contained (no node taken down): the socket does not exist, so applying would fail.
    out = gpu_actions.inject_gpu_fault("gpu-xid-45", "gpu-0", 2, configuration=cfg)
    assert out["dry_run"] is True
    assert "[dry-run] would inject DCGM field 230=45 on gpu-0 GPU 2" in capsys.readouterr().out
    led = Ledger(parse_settings(cfg).ledger)
    assert [r.dry_run for r in led.records()] == [True] and led.pending() == []


def test_unknown_fault_is_an_invalid_activity(tmp_path: Path) -> None:
    _sandbox_state(tmp_path)
    cfg = {
        "gpufleet_backend": "sandbox",
        "gpufleet_stack": "sandbox",
        "gpufleet_sandbox_root": str(tmp_path),
        "gpufleet_stacks_dir": str(Path(__file__).parents[3] / "stacks"),
    }
    with pytest.raises(InvalidActivity, match="no fault 'gpu-xid-999'"):
        gpu_actions.inject_gpu_fault("gpu-xid-999", "gpu-0", configuration=cfg)


def test_sigterm_reverts_this_runs_faults_then_interrupts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[Any] = []
    monkeypatch.setitem(ROLLBACKS, "test.touch", lambda a: done.append(a["n"]))
    cfg = {"gpufleet_ledger": str(tmp_path / "faults.jsonl")}
    control.configure_control(experiment={"title": "t"}, configuration=cfg)
    try:
        led = Ledger(tmp_path / "faults.jsonl")
        led.record(
            FaultRecord(
                kind="link-down",
                backend="sandbox",
                target={},
                rollback=Rollback("test.touch", {"n": 1}),
                run_id=engine.run_of(cfg).run_id,
            )
        )
        led.record(
            FaultRecord(
                kind="link-down",
                backend="sandbox",
                target={},
                rollback=Rollback("test.touch", {"n": 2}),
                run_id="another-run",
            )
        )
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        assert done == [1]  # only this run's fault; `gpufleet chaos revert` handles the others
        assert [r.run_id for r in led.pending()] == ["another-run"]
    finally:
        control.cleanup_control()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler) or callable(
        signal.getsignal(signal.SIGTERM)
    )


def test_after_experiment_reverts_even_a_failed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[Any] = []
    monkeypatch.setitem(ROLLBACKS, "test.touch", lambda a: done.append(a["n"]))
    cfg = {"gpufleet_ledger": str(tmp_path / "faults.jsonl")}
    control.configure_control(experiment={"title": "t"}, configuration=cfg)
    try:
        Ledger(tmp_path / "faults.jsonl").record(
            FaultRecord(
                kind="link-down",
                backend="sandbox",
                target={},
                rollback=Rollback("test.touch", {"n": 7}),
                run_id=engine.run_of(cfg).run_id,
            )
        )
        control.after_experiment_control(context={}, state={"status": "failed"}, configuration=cfg)
        assert done == [7]
        control.after_experiment_control(context={}, state={"status": "failed"}, configuration=cfg)
        assert done == [7]  # idempotent
    finally:
        control.cleanup_control()


def test_cli_revert_after_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    done: list[Any] = []
    monkeypatch.setitem(ROLLBACKS, "test.touch", lambda a: done.append(a["n"]))
    led = Ledger(tmp_path / "faults.jsonl")
    led.record(
        FaultRecord(
            kind="link-down",
            backend="sandbox",
            target={"node": "gpu-1"},
            rollback=Rollback("test.touch", {"n": 1}),
        )
    )
    r = CliRunner().invoke(app, ["chaos", "revert", "--ledger", led.where])
    assert r.exit_code == 0, r.output
    assert done == [1] and "reverted" in r.output
    r = CliRunner().invoke(app, ["chaos", "revert", "--ledger", led.where])
    assert r.exit_code == 0 and "nothing to revert" in r.output and done == [1]
    r = CliRunner().invoke(app, ["chaos", "ledger", "--ledger", led.where, "--json"])
    assert json.loads(r.output)[0]["reverted_at"] is not None
