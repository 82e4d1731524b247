"""`gpufleet preview`: offline view printed, JSON written, bad stacks exit 2 without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from infra_testdata import ROOT, shipped
from typer.testing import CliRunner

from gpufleet.cli.main import app


def test_preview_prints_an_offline_view_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r" / "h200.json"
    result = CliRunner().invoke(
        app, ["preview", "--stack", "h200-ib", "--stacks-dir", str(ROOT / "stacks"), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "OFFLINE VIEW" in result.output and "mock runtime" in result.output
    spec, _ = shipped("h200-ib")
    assert str(spec.total_gpus) in result.output and "kubernetes:core/v1:NodePatch" in result.output
    doc = json.loads(out.read_text())
    assert doc["offline"] is True and doc["stack"] == "h200-ib"
    assert doc["resourceCount"] == sum(1 for r in doc["resources"] if r["custom"])
    assert spec.storage.ceph is not None
    storage_nodes = len(spec.storage.ceph.storage_nodes)
    assert doc["byType"]["kubernetes:core/v1:NodePatch"] == spec.total_nodes + storage_nodes
    assert doc["outputs"]["gpus"] == spec.total_gpus
    secrets = [r for r in doc["resources"] if r["type"] == "kubernetes:core/v1:Secret"]
    # grafana-admin, the JuiceFS CSI Secret and the backups' copy (ADR 0060)
    assert len(secrets) == 3 and all(s["inputs"]["stringData"] == "[secret]" for s in secrets)


def test_preview_of_a_bad_stack_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    text = (
        (ROOT / "stacks" / "Pulumi.mi300x-roce.yaml")
        .read_text()
        .replace("railsPerNode: 8", "railsPerNode: 9")
    )
    bad.write_text(text)
    result = CliRunner().invoke(app, ["preview", "--stack", "bad", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "fabric" in result.output and "railsPerNode (9) exceeds nicsPerNode (8)" in result.output
    assert "Traceback" not in result.output
    missing = CliRunner().invoke(app, ["preview", "--stack", "nope", "--stacks-dir", str(tmp_path)])
    assert missing.exit_code == 2 and "no such stack" in missing.output
