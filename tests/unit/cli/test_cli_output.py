"""Tables fit the terminal (80 and 200 columns, a pipe) and every command that prints a table has
`--output json`: one JSON document on stdout, no markup."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.cli import catalog_cmds
from gpufleet.cli.main import app

ROOT = Path(__file__).parents[3]
STACKS = ROOT / "stacks"
ANSI = re.compile(r"\x1b\[")
runner = CliRunner()


def catalog_list(monkeypatch: pytest.MonkeyPatch, width: int, tty: bool) -> str:
    out = io.StringIO()
    monkeypatch.setattr(catalog_cmds, "console", Console(file=out, width=width, force_terminal=tty))
    result = runner.invoke(app, ["catalog", "list"])
    assert result.exit_code == 0, result.output
    return ANSI.sub("", re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()))


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_catalog_list_at_80_columns_keeps_ids_class_and_action_whole(
    monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    text = catalog_list(monkeypatch, 80, tty)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in text
    header = next(line for line in lines if line.startswith("id"))
    assert header.split() == ["id", "class", "severity", "action"]
    rows = {line.split()[0]: line.split() for line in lines if line[:1].strip() and len(line.split()) == 4}
    for f in load_catalog():
        assert rows[f.id][1:] == [f.fault_class.value, f.severity.value, f.action.value], f.id
    assert "hidden at this width: domain, XID, alert, escalation" in " ".join(text.split())


def test_catalog_list_at_200_columns_shows_every_column(monkeypatch: pytest.MonkeyPatch) -> None:
    text = catalog_list(monkeypatch, 200, True)
    header = next(line for line in text.splitlines() if " id " in line)
    assert [h.strip() for h in header.strip("┃ ").split("┃")] == [
        "id", "domain", "class", "severity", "XID", "alert", "action", "escalation"]
    assert "GpuFallenOffBus" in text and "2x/168h -> replace" in text and "hidden" not in text


def test_catalog_list_in_a_pipe_via_the_cli() -> None:
    # CliRunner's stdout is not a terminal: rich falls back to 80 columns
    result = runner.invoke(app, ["catalog", "list"], env={"COLUMNS": None})
    assert result.exit_code == 0
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "workload-silent-data-corruption" in result.stdout and "…" not in result.stdout


def test_catalog_list_json_has_every_fault_and_field() -> None:
    result = runner.invoke(app, ["catalog", "list", "--output", "json", "--class", "gpu-fatal"],
                           env={"FORCE_COLOR": "1", "COLUMNS": "40"})
    assert result.exit_code == 0
    assert not ANSI.search(result.stdout)
    doc = json.loads(result.stdout)
    fatal = [f for f in load_catalog() if f.fault_class.value == "gpu-fatal"]
    assert [d["id"] for d in doc] == [f.id for f in fatal]
    xid79 = next(d for d in doc if d["id"] == "gpu-xid-79")
    assert xid79 == {
        "id": "gpu-xid-79", "title": "GPU has fallen off the bus", "domain": "gpu", "class": "gpu-fatal",
        "severity": "critical", "xid": 79, "alert": "GpuFallenOffBus", "action": "reboot-node",
        "escalation": {"repeats": 2, "window_hours": 168.0, "to": "replace"},
    }


def test_catalog_show_json() -> None:
    result = runner.invoke(app, ["catalog", "show", "gpu-xid-45", "-o", "json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["id"] == "gpu-xid-45" and doc["alert"]["name"] == "GpuXid45Storm"
    assert doc["domain"] == "gpu" and doc["runbook_url"].endswith("GpuXid45Storm.md")
    assert doc["injection"]["method"] == "dcgm-inject" and doc["injection"]["burst"] == 20


def test_an_unknown_output_format_is_refused() -> None:
    result = runner.invoke(app, ["catalog", "list", "--output", "yaml"])
    assert result.exit_code == 2 and "yaml" in result.output


def test_simulate_json_is_the_study_document(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = runner.invoke(app, ["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--days", "3",
                                 "--runs", "3", "--workers", "1", "--no-plots", "--out", str(out),
                                 "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpufleet.simulate/v1" and doc["runs"] == 3 and doc["config"]["days"] == 3
    # the same document; strict JSON has no NaN/Infinity: null there (e.g. MTBF with no failure)
    assert doc == json.loads((out / "simulate.json").read_text(), parse_constant=lambda _: None)
    assert "wrote" in result.stderr and "wrote" not in result.stdout


def test_simulate_without_runs_chooses_them_by_precision(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--days", "3",
                                 "--precision", "0.05", "--workers", "1", "--no-plots", "--out",
                                 str(tmp_path / "sim"), "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    chosen = doc["runs_chosen_by_precision"]
    assert chosen["target_half_width"] == 0.05 and chosen["max_runs"] == 200
    assert 10 <= doc["runs"] <= 200 and doc["metrics"]["ettr"]["runs"] == doc["runs"]
    ettr = doc["metrics"]["ettr"]
    reached = (ettr["ci95_high"] - ettr["ci95_low"]) / 2
    assert reached == pytest.approx(chosen["half_width"])
    assert reached <= 0.05 or doc["runs"] == 200


def test_preview_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["preview", "--stack", "sandbox", "--stacks-dir", str(STACKS), "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["offline"] is True and doc["stack"] == "sandbox"
    assert doc["outputs"]["gpus"] == 40 and sum(doc["resources_by_type"].values()) > 0
