"""Benchmark: evaluate the `scale-10k` stack with the Pulumi program under Pulumi's mock runtime.

Prints the wall time (median of 3 runs, plus CPU time: on a shared machine the wall time includes
waiting for the CPU) and the resource count, then the counts for smaller and larger copies of the
stack, static and Karpenter, to show which resources grow with nodes: one NodePatch per static
node and one HyperNode per leaf group; nothing per node for Karpenter pools.
Writes benchmarks/results/preview_scale.json. A benchmark, not a test: it asserts nothing.

    .venv/bin/python benchmarks/preview_scale.py [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
from gpufleet.config import StackSpec, load_named_stack  # noqa: E402
from gpufleet.infra.offline import run_offline  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - T0
ROOT = Path(__file__).resolve().parents[1]
NODE_PATCH = "kubernetes:core/v1:NodePatch"
HYPERNODE = "kubernetes:topology.volcano.sh/v1alpha1:HyperNode"


def resized(spec: StackSpec, factor: float, karpenter: bool) -> StackSpec:
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for pool in data["nodePools"]:
        pool["nodes"] = max(1, round(pool["nodes"] * factor))
        pool["spares"] = min(pool["spares"], pool["nodes"] - 1)
        if karpenter:
            pool["provisioning"] = {"kind": "karpenter", "instanceTypes": ["p5.48xlarge"]}
    return StackSpec.model_validate(data)


def measure(spec: StackSpec, name: str) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    view = run_offline(spec, name)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    counts = view.by_type()
    total = len(view.custom())
    return {
        "nodes": spec.total_nodes,
        "gpus": spec.total_gpus,
        "resources": total,
        "nodePatches": counts.get(NODE_PATCH, 0),
        "hyperNodes": counts.get(HYPERNODE, 0),
        "perStack": total - counts.get(NODE_PATCH, 0) - counts.get(HYPERNODE, 0),
        "wallSeconds": round(wall, 3),
        "cpuSeconds": round(cpu, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "preview_scale.json")
    args = parser.parse_args()

    spec = load_named_stack("scale-10k", ROOT / "stacks")
    runs = [measure(spec, "scale-10k") for _ in range(args.runs)]
    median_wall = statistics.median(r["wallSeconds"] for r in runs)
    median_cpu = statistics.median(r["cpuSeconds"] for r in runs)
    print(f"scale-10k: {spec.total_nodes} nodes, {spec.total_gpus} GPUs, {runs[0]['resources']} resources")
    print(
        f"  imports {IMPORT_SECONDS:.2f} s; runs (wall/cpu s): "
        + ", ".join(f"{r['wallSeconds']:.2f}/{r['cpuSeconds']:.2f}" for r in runs)
    )
    print(
        f"  median wall {median_wall:.2f} s, median CPU {median_cpu:.2f} s (target < 10 s on 2 cores); "
        f"first run includes parsing the fault catalog once"
    )

    sizes = []
    print(
        f"\n{'provisioning':<12} {'nodes':>6} {'GPUs':>7} {'resources':>9} {'NodePatch':>9} "
        f"{'HyperNode':>9} {'per stack':>9} {'wall s':>7}"
    )
    for karpenter in (False, True):
        for factor in (0.25, 0.5, 1.0, 2.0):
            row = measure(resized(spec, factor, karpenter), "scale-10k")
            row["provisioning"] = "karpenter" if karpenter else "static"
            sizes.append(row)
            print(
                f"{row['provisioning']:<12} {row['nodes']:>6} {row['gpus']:>7} {row['resources']:>9} "
                f"{row['nodePatches']:>9} {row['hyperNodes']:>9} {row['perStack']:>9} "
                f"{row['wallSeconds']:>7.2f}"
            )

    result = {
        "benchmark": "preview_scale",
        "stack": "scale-10k",
        "runtime": "pulumi mock runtime (offline; no Pulumi CLI or engine)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg": list(os.getloadavg()),
        },
        "importSeconds": round(IMPORT_SECONDS, 3),
        "runs": runs,
        "medianWallSeconds": median_wall,
        "medianCpuSeconds": median_cpu,
        "resources": runs[0]["resources"],
        "sizes": sizes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
