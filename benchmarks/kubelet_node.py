"""Kubelet node benchmark (ADR 0081, 0082): what a real kubelet node adds to the Kubernetes sandbox's
bring-up, what it holds in memory, and how long the upgrade gate's smoke pod takes on it.

    .venv/bin/python benchmarks/kubelet_node.py [--runs 3]

Each run brings up the sandbox stack with 2 nodes, the first a kubelet node, no training and no GPU
Operator, in a state root of its own (a temporary folder), runs the gate's smoke pod (gpufleet's one-step
training run, 2 ranks) on the kubelet node through the GPU Operator driver, and takes the sandbox
down. Needs root and `make kube-bins`. Prints a table and writes
benchmarks/results/kubelet_node.json. Figures, not asserts; the verdicts are counted (N of N).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.config import load_named_stack
from gpufleet.fleet.node_pod import NodePod
from gpufleet.fleet.upgrade.kube_driver import GpuOperatorDriver
from gpufleet.fleet.upgrade.model import Component
from gpufleet.sandbox.kube import kubelet_node
from gpufleet.sandbox.kube.cluster import KubeUpOptions, kube_down, kube_up
from gpufleet.sandbox.processes import rss_bytes

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "kubelet_node.json"
STACK = "sandbox"
NODE = "gpu-0"  # the pool's only compute node at 2 nodes (the other is its spare): the kubelet node
MIB = 1024 * 1024


def one() -> dict[str, Any]:
    spec = load_named_stack(STACK, REPO / "stacks")
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="kubelet-bench-") as tmp:
        root = Path(tmp)
        opts = KubeUpOptions(nodes=2, training=False, gpu_operator=False, kubelet_nodes=1, timeout_s=300)
        try:
            t0 = time.monotonic()
            rec, timings = kube_up(STACK, spec, opts, root=root)
            up_s = time.monotonic() - t0
            state = rec.state
            rss = {p.name: round(rss_bytes(p.pid) / MIB, 1) for p in state.processes
                   if p.name.endswith(NODE)}
            assert state.admin_kubeconfig is not None
            smoke = NodePod(image=kubelet_node.NODE_IMAGE, image_pull_policy="Never", deadline_s=120,
                            command=kubelet_node.smoke_command(NODE, 8, 2, 60.0), namespace="default",
                            env=kubelet_node.SMOKE_ENV, host_paths=kubelet_node.python_env_paths())
            driver = GpuOperatorDriver(Path(state.admin_kubeconfig), Component.DRIVER, root / "cordons.json",
                                       smoke=smoke)
            t1 = time.monotonic()
            passed, detail = driver.smoke_pod(NODE)
            smoke_s = time.monotonic() - t1
        finally:
            t2 = time.monotonic()
            report = kube_down(STACK, root)
            down_s = time.monotonic() - t2
    marks = timings.marks
    return {
        "up_s": round(up_s, 2),
        "kubelet_node_s": round(marks["kubelet_nodes"] - marks["nodes_ready"], 2),
        "smoke_pod_s": round(smoke_s, 2),
        "smoke_passed": passed,
        "smoke_detail": detail,
        "down_s": round(down_s, 2),
        "down_clean": bool(report and report.clean),
        "rss_mib": rss,
        "load_before": load_before,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs = []
    for i in range(args.runs):
        r = one()
        runs.append(r)
        print(f"run {i + 1}: up {r['up_s']} s (kubelet node {r['kubelet_node_s']} s), smoke pod "
              f"{r['smoke_pod_s']} s {'passed' if r['smoke_passed'] else 'FAILED'}, down {r['down_s']} s "
              f"{'clean' if r['down_clean'] else 'NOT clean'}, RSS {r['rss_mib']} MiB, "
              f"load {r['load_before']}", flush=True)

    def median(key: str) -> float:
        return round(statistics.median(float(r[key]) for r in runs), 2)

    summary = {
        "runs": len(runs),
        "median_up_s": median("up_s"),
        "median_kubelet_node_s": median("kubelet_node_s"),
        "median_smoke_pod_s": median("smoke_pod_s"),
        "median_down_s": median("down_s"),
        "smoke_passed": f"{sum(r['smoke_passed'] for r in runs)} of {len(runs)}",
        "down_clean": f"{sum(r['down_clean'] for r in runs)} of {len(runs)}",
    }
    print(json.dumps(summary))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                                   "date": time.strftime("%Y-%m-%d"), "summary": summary, "runs": runs},
                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
