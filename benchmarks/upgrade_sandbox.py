"""A rolling driver upgrade of the whole Slurm sandbox under its training job (issue 16: capacity
lost within 1.2x the minimum).

    sudo .venv/bin/python benchmarks/upgrade_sandbox.py [--runs 1] [--driver slurm|sandbox]

Each run: `gpufleet sandbox up --stack sandbox` in a private state root, wait for training steps,
`gpufleet upgrade run --to <new>` (waves of one, the stack's policy), then `sandbox down`. The
figures come from the run's JSON report: node-seconds drained by the rollout (cordon to resume, every
node), the minimum (the same nodes' reboots and gates alone: what no rollout can avoid), their
ratio, the rollout's wall time, and each node's reboot time (the log's `reboot` to `rebooted`: with
`--driver slurm` a real `scontrol reboot` from the request until slurmctld saw the node's new boot
and its agent answered, ADR 0064; with `--driver sandbox` a restart of the node's daemons, ADR 0061).
Prints them and writes benchmarks/results/upgrade_sandbox.json (sandbox driver) or
upgrade_sandbox_slurm.json. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.fleet.upgrade.drive import reboot_durations

ROOT = Path(__file__).resolve().parents[1]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")


def cli(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root)}
    return subprocess.run([GPUFLEET, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def max_step(events: Path) -> int:
    steps = [json.loads(line).get("step") for line in events.read_text().splitlines()
             if '"event": "step"' in line or '"event":"step"' in line]
    return max((s for s in steps if isinstance(s, int)), default=-1)


TIMEOUT_KEYS = ("drainTimeoutSeconds", "rebootTimeoutSeconds", "gateTimeoutSeconds")


def stack_with_timeouts(tmp: Path, seconds: int) -> Path:
    """A copy of the sandbox stack whose rollout timeouts are `seconds` (a loaded shared machine can
    take longer than the stack's 60 s to drain a busy node)."""
    lines = (ROOT / "stacks" / "Pulumi.sandbox.yaml").read_text().splitlines()
    for i, ln in enumerate(lines):
        key = ln.strip().split(":", 1)[0]
        if key in TIMEOUT_KEYS:
            lines[i] = ln[: len(ln) - len(ln.lstrip())] + f"{key}: {seconds}"
    out = tmp / "Pulumi.sandbox.yaml"
    out.write_text("\n".join(lines) + "\n")
    return out


def one_run(target: str, driver: str, timeouts_s: int | None) -> dict[str, Any]:
    from gpufleet.core.sandbox_contract import read_state

    with tempfile.TemporaryDirectory(prefix="gpufleet-upgrade-bench-") as tmp:
        root = Path(tmp)
        up = cli(root, "sandbox", "up", "--stack", "sandbox")
        try:
            if up.returncode != 0:
                raise RuntimeError(f"sandbox up failed: {up.stdout[-2000:]} {up.stderr[-2000:]}")
            events = Path(read_state("sandbox", root).training_events or "")
            deadline = time.monotonic() + 120
            while max_step(events) < 5 and time.monotonic() < deadline:
                time.sleep(1)
            report = root / "report.json"
            load = os.getloadavg()[0]
            stack = "sandbox" if timeouts_s is None else str(stack_with_timeouts(root, timeouts_s))
            res = cli(root, "upgrade", "run", "--stack", stack, "--driver", driver, "--to", target,
                      "--report", str(report), timeout=1800)
            doc = json.loads(report.read_text())
            log = doc["log"]
            secs = reboot_durations(log)
            # A busy node's drain: from its eviction to its reboot (the job's teardown and Epilog).
            reboots = [(b["t"], b["node"]) for b in log if b["action"] == "reboot"]
            drains = [round(min(t for t, n in reboots if n == a["node"] and t >= a["t"]) - a["t"], 2)
                      for a in log if a["action"] == "evict"
                      and any(n == a["node"] and t >= a["t"] for t, n in reboots)]
            return {"driver": driver, "timeoutsSeconds": timeouts_s, "exitCode": res.returncode,
                    "counts": doc["counts"], "haltedBy": doc["haltedBy"], "gateNote": doc.get("gateNote"),
                    **doc["capacity"], "rebootSeconds": secs,
                    "rebootSecondsMedian": sorted(secs)[len(secs) // 2] if secs else None,
                    "busyNodeDrainSeconds": drains,
                    "loadAverageAtStart": round(load, 1), "loadAverageAtEnd": round(os.getloadavg()[0], 1),
                    "slurmReboots": doc.get("slurmReboots", [])}
        finally:
            cli(root, "sandbox", "down", "--stack", "sandbox", timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--to", default="570.124.06")
    ap.add_argument("--driver", choices=("slurm", "sandbox"), default="slurm")
    ap.add_argument("--timeouts-s", type=int, default=None,
                    help="drain/reboot/gate timeouts for the rollout (default: the stack's)")
    args = ap.parse_args()
    runs = [one_run(args.to, args.driver, args.timeouts_s) for _ in range(args.runs)]
    for r in runs:
        print(f"{r['driver']}: exit {r['exitCode']} {r['counts']}: drained {r['drainedNodeSeconds']} node-s, "
              f"minimum {r['minimumNodeSeconds']} node-s, ratio {r['ratio']}, wall {r['wallSeconds']} s; "
              f"reboots {r['rebootSeconds']} s; busy nodes' drains (evict to reboot) "
              f"{r['busyNodeDrainSeconds']} s; load {r['loadAverageAtStart']} -> {r['loadAverageAtEnd']}")
    name = "upgrade_sandbox.json" if args.driver == "sandbox" else "upgrade_sandbox_slurm.json"
    out = ROOT / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                               "loadavg": os.getloadavg(), "runs": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
