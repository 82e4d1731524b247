"""`gpufleet upgrade plan`: waves from the stack or a snapshot file; bad input is exit 2 with the
file, the path inside it and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from gpufleet.cli.main import app

STACKS = Path(__file__).parents[3] / "stacks"
runner = CliRunner()


def run(*args: str) -> Result:
    result = runner.invoke(app, ["upgrade", "plan", "--stacks-dir", str(STACKS), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def test_plan_from_the_stack_says_what_it_did_not_know() -> None:
    result = run("--stack", "scale-10k", "--to", "570.124.06", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["source"] == "stack" and "no live backend" in doc["note"]
    assert doc["waves"][0]["canary"] and doc["plannedNodes"] == doc["unknownVersion"]
    text = run("--stack", "sandbox", "--to", "570.124.06")
    assert text.exit_code == 0
    assert "no live backend given" in " ".join(text.stdout.split())
    assert "canary" in text.stdout


def test_plan_from_a_snapshot_leaves_out_others_cordons(tmp_path: Path) -> None:
    snap = {
        "component": "driver",
        "nodes": [
            {"name": "gpu-0", "pool": "gpu", "version": "550", "cordonedBy": "alice"},
            {"name": "gpu-1", "pool": "gpu", "version": "570.124.06"},
            {"name": "gpu-2", "pool": "gpu", "version": "550", "jobs": [{"id": "7", "queue": "batch"}]},
            {"name": "gpu-3", "pool": "gpu", "version": "550"},
        ],
    }
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps(snap))
    result = run("--stack", "sandbox", "--to", "570.124.06", "--snapshot", str(f), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["source"] == "file" and "note" not in doc
    assert doc["waves"] == [{"index": 0, "canary": True, "nodes": ["gpu-3"]},
                            {"index": 1, "canary": False, "nodes": ["gpu-2"]}]
    assert doc["leftOut"] == [{"node": "gpu-0", "reason": "cordoned-by-other", "detail": "cordoned by alice"}]
    assert doc["upToDate"] == ["gpu-1"]


def test_bad_input_is_exit_2_never_a_traceback(tmp_path: Path) -> None:
    bad = run("--stack", "sandbox", "--to", "-x")
    assert bad.exit_code == 2 and "is not a version" in bad.output
    f = tmp_path / "fleet.yaml"
    f.write_text("nodes:\n  - name: a\n    pool: p\n    cordonnedBy: bob\n  - {name: b}\n")
    bad = run("--stack", "sandbox", "--to", "1.0", "--snapshot", str(f))
    assert bad.exit_code == 2
    err = " ".join(bad.stderr.split())
    assert f"{f}: nodes[0].cordonnedBy: unknown key" in err
    assert f"{f}: nodes[1].pool: required key is missing" in err
    f.write_text("component: firmware\nnodes: [{name: a, pool: p}]\n")
    bad = run("--stack", "sandbox", "--to", "1.0", "--snapshot", str(f))
    assert bad.exit_code == 2
    err = " ".join(bad.stderr.split())
    assert f"{f}: component: the snapshot observed the firmware, not the driver" in err
    assert run("--stack", "nosuch", "--to", "1.0").exit_code == 2
