"""`gpufleet catalog list|show|check` and `gpufleet generate [--check]`."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.cli.main import app

runner = CliRunner()


def test_catalog_list_filters_by_class() -> None:
    result = runner.invoke(app, ["catalog", "list", "--class", "gpu-fatal"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    fatal = {f.id for f in load_catalog() if f.fault_class.value == "gpu-fatal"}
    for fault_id in fatal:
        assert fault_id in result.output
    assert "gpu-xid-13" not in result.output
    assert f"({len(fatal)} of {len(load_catalog())})" in result.output


def test_catalog_list_rejects_an_unknown_class() -> None:
    result = runner.invoke(app, ["catalog", "list", "--class", "gpu-broken"])
    assert result.exit_code == 2


def test_catalog_show() -> None:
    result = runner.invoke(app, ["catalog", "show", "gpu-xid-45"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "GpuXid45Storm" in result.output and "secondary to any" in result.output


def test_catalog_show_unknown_id_fails_cleanly() -> None:
    result = runner.invoke(app, ["catalog", "show", "gpu-xid-999"])
    assert result.exit_code == 1
    assert "no fault 'gpu-xid-999'" in result.output and "Traceback" not in result.output


def test_catalog_check_builtin() -> None:
    result = runner.invoke(app, ["catalog", "check"])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


def test_generate_check_on_the_repository_passes() -> None:
    result = runner.invoke(app, ["generate", "--check"])
    assert result.exit_code == 0, result.output


def test_generate_check_fails_naming_every_drifted_file(tmp_path: Path) -> None:
    assert runner.invoke(app, ["generate", "--root", str(tmp_path)]).exit_code == 0
    (tmp_path / "runbooks" / "NodeDown.md").write_text("edited by hand\n")
    (tmp_path / "monitoring" / "tests" / "extra.test.yaml").write_text("tests: []\n")
    result = runner.invoke(app, ["generate", "--check", "--root", str(tmp_path)])
    assert result.exit_code == 1
    assert "runbooks/NodeDown.md (differs)" in result.output
    assert "monitoring/tests/extra.test.yaml (stale)" in result.output
    assert (tmp_path / "runbooks" / "NodeDown.md").read_text() == "edited by hand\n"  # --check wrote nothing
