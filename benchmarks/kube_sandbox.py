"""Kubernetes sandbox benchmark: bring-up time to every kwok node Ready (and the training Job's
pods Running), resident memory of each daemon, and `down` time, at one or more sizes.

    .venv/bin/python benchmarks/kube_sandbox.py                       # sandbox stack at 6 nodes,
                                                                      # scale-10k at 1,250 (10,000 GPUs)
    .venv/bin/python benchmarks/kube_sandbox.py --run sandbox:6 --settle 10

Each run gets its own state root (a temporary folder), so it never meets a sandbox someone else
runs. Prints a table and writes benchmarks/results/kube_sandbox.json. Figures, not asserts.
RSS is read from /proc/<pid>/status (VmRSS) right after `up` returns and again after `--settle`
seconds (the controllers' caches and the first node heartbeats settle in that time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.config import load_named_stack
from gpufleet.sandbox.kube.cluster import KubeUpOptions, kube_down, kube_status, kube_up
from gpufleet.sandbox.processes import rss_bytes

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "kube_sandbox.json"
MIB = 1024 * 1024


def rss(state: Any) -> dict[str, float]:
    return {p.name: round(rss_bytes(p.pid) / MIB, 1) for p in state.processes}


def one(stack: str, nodes: int, settle_s: float) -> dict[str, Any]:
    spec = load_named_stack(stack, REPO / "stacks")
    load_before = round(os.getloadavg()[0], 2)  # the machine may be shared: say how busy it was
    with tempfile.TemporaryDirectory(prefix="kube-bench-") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        try:
            rec, timings = kube_up(stack, spec, KubeUpOptions(nodes=nodes, timeout_s=900), root=root)
            up_s = time.monotonic() - t0
            state = rec.state
            rss_up = rss(state)
            time.sleep(settle_s)
            rss_settled = rss(state)
            status = kube_status(state)
        finally:
            t1 = time.monotonic()
            report = kube_down(stack, root)
            down_s = time.monotonic() - t1
        gpus = nodes * spec.node_pools[0].gpus_per_node if len(spec.node_pools) == 1 else None
        return {
            "stack": stack,
            "nodes": nodes,
            "gpus": gpus,
            "up_seconds": round(up_s, 2),
            "marks": timings.marks,
            "rss_mib_at_up": rss_up,
            "rss_mib_settled": rss_settled,
            "rss_mib_total_settled": round(sum(rss_settled.values()), 1),
            "settle_seconds": settle_s,
            "status": {"nodes": status["nodes"], "pods": status["pods"]},
            "down_seconds": round(down_s, 2),
            "down_clean": bool(report and report.clean),
            "load_avg_1m_before": load_before,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--run",
        action="append",
        help="stack:nodes (repeatable); default sandbox:6 and scale-10k:1250",
    )
    ap.add_argument("--settle", type=float, default=30.0, help="seconds between the two RSS readings")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    runs = args.run or ["sandbox:6", "scale-10k:1250"]
    results = []
    for item in runs:
        stack, _, count = item.partition(":")
        print(f"{stack} at {count} nodes ...", flush=True)
        r = one(stack, int(count), args.settle)
        results.append(r)
        m = r["marks"]
        print(
            f"  up {r['up_seconds']:.1f} s (apiserver ready {m.get('apiserver')} s, CRDs {m.get('crds')} s, "
            f"nodes created {m.get('nodes_created')} s, nodes Ready {m.get('nodes_ready')} s, "
            f"training {m.get('training')} s); down {r['down_seconds']:.1f} s (clean: {r['down_clean']}); "
            f"load average before {r['load_avg_1m_before']}",
            flush=True,
        )
        for name, mib in r["rss_mib_settled"].items():
            print(f"    {name:<24} RSS {r['rss_mib_at_up'][name]:>7.1f} MiB at up, {mib:>7.1f} MiB settled")
        print(f"    {'total':<24} {r['rss_mib_total_settled']:>7.1f} MiB settled", flush=True)
    doc = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
