"""Rolling driver upgrades of the Kubernetes sandbox through the real GPU Operator's upgrade
controller (`gpufleet upgrade run --driver gpu-operator`, ADR 0073).

    .venv/bin/python benchmarks/upgrade_gpu_operator.py [--runs 3]

Each run: `gpufleet sandbox up --kubernetes --stack sandbox` (5 kwok nodes, the training Job's 2 pods
under a PodDisruptionBudget of minAvailable 1) in a private state root; the stack's bad version
(how long until the canary is stopped and rolled back, and how many nodes were touched); then the
good version on every node in waves of one (capacity lost: node-seconds cordoned against the
minimum, the operator's upgrades and the gates); then `sandbox down`. Prints each run and writes
benchmarks/results/upgrade_gpu_operator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpufleet.fleet.upgrade.drive import reboot_durations

ROOT = Path(__file__).resolve().parents[1]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
STACK = "sandbox"


def cli(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root)}
    return subprocess.run([GPUFLEET, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def rollout(root: Path, version: str) -> dict[str, Any]:
    report = root / f"report-{version}.json"
    res = cli(root, "upgrade", "run", "--stack", STACK, "--driver", "gpu-operator", "--to", version,
              "--report", str(report), timeout=900)
    if not report.exists():
        raise RuntimeError(f"upgrade run wrote no report: {res.stdout[-2000:]} {res.stderr[-2000:]}")
    doc = json.loads(report.read_text())
    secs = reboot_durations(doc["log"])
    return {"version": version, "exitCode": res.returncode, "counts": doc["counts"],
            "haltedBy": doc["haltedBy"], **doc["capacity"], "upgradeSeconds": secs,
            "nodesTouched": len({e["node"] for e in doc["log"] if e["action"] == "cordon"}),
            "evictions": sum(1 for e in doc["log"] if e["action"] == "evict")}


def one_run(good: str, bad: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpufleet-operator-bench-") as tmp:
        root = Path(tmp)
        up = cli(root, "sandbox", "up", "--kubernetes", "--stack", STACK, "--timeout", "240")
        try:
            if up.returncode != 0:
                raise RuntimeError(f"sandbox up failed: {up.stdout[-2000:]} {up.stderr[-2000:]}")
            load = os.getloadavg()[0]
            return {"bad": rollout(root, bad), "good": rollout(root, good),
                    "loadAverageAtStart": round(load, 1), "loadAverageAtEnd": round(os.getloadavg()[0], 1)}
        finally:
            cli(root, "sandbox", "down", "--kubernetes", "--stack", STACK, timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--to", default="570.124.06")
    ap.add_argument("--bad", default="560.0.0-bad", help="a version in the stack's sandbox.badVersions")
    args = ap.parse_args()
    runs = [one_run(args.to, args.bad) for _ in range(args.runs)]
    for r in runs:
        b, g = r["bad"], r["good"]
        print(f"bad {b['version']}: exit {b['exitCode']} {b['counts']}, {b['nodesTouched']} node touched, "
              f"stopped in {b['wallSeconds']} s; good {g['version']}: exit {g['exitCode']} {g['counts']}, "
              f"drained {g['drainedNodeSeconds']} node-s vs minimum {g['minimumNodeSeconds']} "
              f"(ratio {g['ratio']}), wall {g['wallSeconds']} s, per-node upgrades {g['upgradeSeconds']} s, "
              f"{g['evictions']} evictions; load {r['loadAverageAtStart']} -> {r['loadAverageAtEnd']}")
    ok = sum(1 for r in runs if r["bad"]["exitCode"] == 1 and r["bad"]["nodesTouched"] == 1
             and r["good"]["exitCode"] == 0)
    print(f"as expected (bad stopped at the canary, good done everywhere): {ok} of {len(runs)}")
    out = ROOT / "benchmarks" / "results" / "upgrade_gpu_operator.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                               "loadavg": os.getloadavg(), "asExpected": f"{ok} of {len(runs)}",
                               "runs": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
