"""Performance pod benchmark (ADR 0083): how repeatable the Kubernetes sandbox's performance pod is,
which decides the floor its stack can hold, and how long one takes.

    .venv/bin/python benchmarks/perf_pod.py [--runs 12]

Brings up the sandbox stack with 2 nodes, the first a kubelet node (no training, no GPU Operator), in
a state root of its own, and runs the sandbox's performance pod (gpufleet's collective probe, gloo on
the CPU, 2 ranks, 64 MiB, the fastest of 60 all_reduces) `--runs` times on the kubelet node. The
first figure plays the reference a rollout measures before its first wave; each later one is a
gate's reading. Prints each figure and its share of the first, counts the readings at or above 80 %
and 90 % (N of N), and writes benchmarks/results/perf_pod.json. Needs root and `make kube-bins`.
Figures, not asserts.

It also asks how often a healthy node's gate would fail for the reference alone (ADR 0092): over
every way the measured figures can play reference and reading, the readings under 80 % of a
reference of one run, and of a reference that is the median of 3 runs (every 3 of the figures, each
reading one of the others), and the lowest reading as a share of its reference in each case.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.cli.node_pods import sandbox_perf_pod
from gpufleet.config import load_named_stack
from gpufleet.fleet.upgrade.kube_driver import GpuOperatorDriver
from gpufleet.fleet.upgrade.model import Component
from gpufleet.sandbox.kube.cluster import KubeUpOptions, kube_down, kube_up

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "perf_pod.json"
STACK = "sandbox"
NODE = "gpu-0"  # the pool's only compute node at 2 nodes: the kubelet node
METRIC = "gloo_allreduce_busbw_gbs"


def measure(runs: int) -> list[dict[str, Any]]:
    spec = load_named_stack(STACK, REPO / "stacks")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="perf-pod-bench-") as tmp:
        root = Path(tmp)
        opts = KubeUpOptions(nodes=2, training=False, gpu_operator=False, kubelet_nodes=1, timeout_s=300)
        try:
            rec, _ = kube_up(STACK, spec, opts, root=root)
            assert rec.state.admin_kubeconfig is not None
            # In `default`, as benchmarks/kubelet_node.py runs its smoke pod.
            pod = dataclasses.replace(sandbox_perf_pod(spec), namespace="default")
            driver = GpuOperatorDriver(Path(rec.state.admin_kubeconfig), Component.DRIVER,
                                       root / "cordons.json")
            for i in range(runs):
                load = round(os.getloadavg()[0], 2)
                t = time.monotonic()
                figures, detail = driver.measure(pod, NODE)
                out.append({"run": i + 1, "figure": figures.get(METRIC),
                            "pod_s": round(time.monotonic() - t, 2), "load_before": load,
                            "detail": detail if not figures else None})
                print(f"run {i + 1}: {METRIC} {figures.get(METRIC)} in {out[-1]['pod_s']} s (load {load})"
                      + (f": {detail}" if not figures else ""), flush=True)
        finally:
            kube_down(STACK, root)
    return out


def against_references(figures: list[float], floor: float, reference_runs: int) -> tuple[int, int, float]:
    """(readings under `floor` x reference, readings compared, the lowest reading as a share of its
    reference) over every `reference_runs` of the figures as the reference (their median) and each
    other figure as the reading."""
    under = total = 0
    lowest = math.inf
    for chosen in itertools.combinations(range(len(figures)), reference_runs):
        ref = statistics.median(figures[i] for i in chosen)
        for j, f in enumerate(figures):
            if j not in chosen:
                total += 1
                under += f < floor * ref
                lowest = min(lowest, f / ref)
    return under, total, lowest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    args = ap.parse_args()
    if not 4 <= args.runs <= 30:
        ap.error("--runs must be 4..30 (a reference of 3 runs and a reading, at the least)")
    runs = measure(args.runs)
    figures = [r["figure"] for r in runs if r["figure"] is not None]
    ref = runs[0]["figure"]
    shares = [round(100 * f / ref, 1) for f in figures[1:]] if ref else []
    summary = {
        "runs": len(runs),
        "measured": f"{len(figures)} of {len(runs)}",
        "reference_gbs": ref,
        "min_gbs": min(figures, default=None),
        "median_gbs": round(statistics.median(figures), 4) if figures else None,
        "max_gbs": max(figures, default=None),
        "max_over_min": round(max(figures) / min(figures), 3) if figures else None,
        "readings_pct_of_reference": shares,
        "at_or_above_80pct": f"{sum(s >= 80 for s in shares)} of {len(shares)}",
        "at_or_above_90pct": f"{sum(s >= 90 for s in shares)} of {len(shares)}",
        "median_pod_s": round(statistics.median(r["pod_s"] for r in runs), 2),
    }
    for k in (1, 3):
        if len(figures) > k:
            under, total, lowest = against_references(figures, 0.8, k)
            summary[f"under_80pct_of_a_{k}_run_reference"] = f"{under} of {total}"
            summary[f"lowest_pct_of_a_{k}_run_reference"] = round(100 * lowest, 1)
    print(json.dumps(summary))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                                   "date": time.strftime("%Y-%m-%d"), "summary": summary, "runs": runs},
                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
