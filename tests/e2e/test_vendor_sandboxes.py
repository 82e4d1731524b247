"""End to end: the AMD MI300X and Ascend 910B sandboxes (their node agents speak device-metrics-exporter's
and npu-exporter's formats, ADR 0047) run the same GPU-fatal, ECC and link experiments as the NVIDIA
one, each judged against the same budgets (stacks/Pulumi.sandbox-*.yaml), and each detected by the
vendor's own alert reading the vendor's series through the sandbox's real Prometheus. Needs root,
Slurm, Prometheus and PyTorch (`make deps`); `gpufleet gameday` brings each sandbox up and down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root"),
    pytest.mark.timeout(900),
]

# stack -> experiment -> the alert of the vendor's exporter (or of node_exporter, for the link) that
# must have fired for the fault
SUITES = {
    "sandbox-mi300x": {
        "amd-gpu-unhealthy": "AmdGpuUnhealthy",
        "amd-gpu-ecc-uncorrectable": "AmdGpuUncorrectableEcc",
        "fabric-link-down": "FabricPortDown",
    },
    "sandbox-ascend": {
        "ascend-npu-unhealthy": "AscendNpuUnhealthy",
        "ascend-hbm-ecc-uncorrectable": "AscendHbmUncorrectableEcc",
        "ascend-link-down": "AscendNpuLinkDown",
    },
}


@pytest.mark.parametrize("stack", sorted(SUITES))
def test_vendor_sandbox_meets_the_same_budgets(stack: str, tmp_path: Path) -> None:
    suite = SUITES[stack]
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "gameday", "--stack", stack, "--backend", "sandbox",
         "--experiments", ",".join(suite), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=840, check=False,
    )
    out = proc.stdout + proc.stderr
    summary = json.loads((report / "summary.json").read_text())
    by_name = {e["name"]: e for e in summary["experiments"]}
    assert list(by_name) == list(suite), out
    for name, alert in suite.items():
        e = by_name[name]
        assert e["result"] == "met", json.dumps(e, indent=1)[:4000]
        measured, budget = e["measured"], e["budget"]
        assert budget["source"] == "stack"  # the sandbox stack's budgets, the NVIDIA sandbox's values
        assert 0 <= measured["detect_seconds"] <= budget["detect_seconds"]
        assert 0 <= measured["isolate_seconds"] <= budget["isolate_seconds"]
        assert 0 <= measured["recover_seconds"] <= budget["recover_seconds"]
        fired = [ev for ev in e["timeline"]["events"]
                 if ev["kind"] == "detected" and ev["source"] == f"prometheus:{alert}"]
        assert fired, f"{name}: {alert} never fired: {json.dumps(e['timeline']['events'], indent=1)}"
        injected = next(ev for ev in e["timeline"]["events"] if ev["kind"] == "injected")
        assert fired[0]["at"] - injected["at"] <= budget["detect_seconds"], (name, alert)
    assert proc.returncode == 0, out
