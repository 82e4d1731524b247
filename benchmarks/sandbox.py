"""Benchmark of the local sandbox: `up` time, resident memory, training step rate.

Runs `gpufleet sandbox up` (the stack `sandbox`) N times (default 3) under a private state root,
and for each run measures:
- up_seconds: wall time of `up` until every node is idle in sinfo and training is progressing
  (target <= 60 s on a 2-core machine), with the phase marks `up` records;
- rss_mib: resident memory of the whole sandbox = sum of VmRSS over every process in the run's
  namespaces plus its root-namespace daemons (munged, the Prometheus forwarder), sampled after
  `settle` seconds of training (target <= 3 GiB);
- steps_per_second: training steps over a `window`-second interval from the events file.
Prints the medians and writes JSON to benchmarks/results/sandbox.json. Needs root.

Usage: .venv/bin/python benchmarks/sandbox.py [--runs 3] [--settle 10] [--window 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.config.load import load_named_stack
from gpufleet.sandbox import network, processes, workload
from gpufleet.sandbox.down import ROOT_NS_PROGRAMS, down
from gpufleet.sandbox.up import UpOptions, up

REPO = Path(__file__).resolve().parents[1]
STACK = "sandbox"


def sandbox_rss(state_namespaces: list[str], base_dir: str) -> tuple[int, int]:
    """(bytes, process count) over the run's namespaces and its root-namespace daemons."""
    pids: set[int] = set()
    for ns in state_namespaces:
        pids.update(network.netns_pids(ns))
    pids.update(processes.pids_mentioning(base_dir, ROOT_NS_PROGRAMS))
    return sum(processes.rss_bytes(p) for p in pids), len(pids)


def one_run(root: Path, settle: float, window: float) -> dict[str, Any]:
    spec = load_named_stack(STACK, REPO / "stacks")
    t0 = time.monotonic()
    rec, timings = up(STACK, spec, UpOptions(timeout_s=240), root=root)
    up_s = time.monotonic() - t0
    st = rec.state
    try:
        time.sleep(settle)
        rss, nproc = sandbox_rss(st.namespaces, st.base_dir)
        events = Path(st.training_events or "")
        p0 = workload.read_progress(events)
        time.sleep(window)
        p1 = workload.read_progress(events)
        rate = (p1.max_step - p0.max_step) / window
    finally:
        report = down(STACK, root)
        assert report is not None and report.clean, report
    return {
        "up_seconds": round(up_s, 2),
        "phases": timings.marks,
        "rss_mib": round(rss / 2**20, 1),
        "processes": nproc,
        "steps_per_second": round(rate, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sandbox.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("the sandbox benchmark needs root", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="gf-bench-") as tmp:
        for i in range(args.runs):
            r = one_run(Path(tmp), args.settle, args.window)
            print(
                f"run {i + 1}: up {r['up_seconds']} s, rss {r['rss_mib']} MiB over {r['processes']} "
                f"processes, {r['steps_per_second']} steps/s",
                flush=True,
            )
            runs.append(r)
    result = {
        "benchmark": "sandbox",
        "stack": STACK,
        "runs": runs,
        "median": {
            k: statistics.median(r[k] for r in runs) for k in ("up_seconds", "rss_mib", "steps_per_second")
        },
        "targets": {"up_seconds": 60, "rss_mib": 3072},
        "machine": {"cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    m = result["median"]
    print(
        f"median of {len(runs)}: up {m['up_seconds']} s (target <= 60), rss {m['rss_mib']} MiB "
        f"(target <= 3072), {m['steps_per_second']} steps/s -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
