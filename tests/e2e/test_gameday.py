"""End to end: `gpufleet gameday` on the real sandbox with two fast experiments — a fatal GPU fault
that must meet its budgets, and the budget-breach test that must FAIL its verdict (and so meet its
expectation). Needs root, Slurm, Prometheus and PyTorch (`make deps`); brings the sandbox up and
down itself unless one is already up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAST = ("gpu-xid79-fallen-off-bus", "recovery-budget-breach")

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root"),
    pytest.mark.timeout(900),
]


def test_gameday_on_the_sandbox(tmp_path: Path) -> None:
    missing = [n for n in FAST if not (REPO / "experiments" / f"{n}.json").exists()]
    assert not missing, f"experiments missing: {missing}"
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "gameday", "--stack", "sandbox", "--backend", "sandbox",
         "--experiments", ",".join(FAST), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=840, check=False,
    )
    out = proc.stdout + proc.stderr
    summary = json.loads((report / "summary.json").read_text())
    by_name = {e["name"]: e for e in summary["experiments"]}
    assert list(by_name) == list(FAST), out

    xid = by_name["gpu-xid79-fallen-off-bus"]
    assert xid["fault_class"] == "gpu-fatal"
    assert xid["result"] == "met", json.dumps(xid, indent=1)
    measured, budget = xid["measured"], xid["budget"]
    assert 0 <= measured["detect_seconds"] <= budget["detect_seconds"]
    assert 0 <= measured["isolate_seconds"] <= budget["isolate_seconds"]
    assert 0 <= measured["recover_seconds"] <= budget["recover_seconds"]
    assert xid["status"] == "completed"

    breach = by_name["recovery-budget-breach"]
    assert (breach["verdict"], breach["expected"], breach["result"]) == ("FAIL", "FAIL", "met"), out
    assert breach["budget"]["source"] == "override"

    assert proc.returncode == 0, out
    assert summary["exit_code"] == 0
    cases = ET.parse(report / "junit.xml").getroot().findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == list(FAST)
    assert all(c.find("failure") is None for c in cases)
    html = (report / "report.html").read_text()
    assert html.count('<img class="timeline"') == 2
    for name in FAST:
        journal = json.loads((report / "journals" / f"{name}.json").read_text())
        assert journal["rollbacks"], f"{name}: rollbacks were not played"
        assert all(r["status"] == "succeeded" for r in journal["rollbacks"])
