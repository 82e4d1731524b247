"""What waiting for every pending deadline changed (issue 18): ETTR at 131,072 GPUs with manual
isolation (`remediation.mode: monitor-only`, a human isolates each node in 3,600 s), simulated by
the model before the change (commit 6bb9273: recovery waited for the latest fault's detect and
isolate only, and dropped a cold spare's remaining boot) and by the current one. Prints figures and
writes benchmarks/results/sim_overlap.json.

Both models run in child processes, each importing its own `gpufleet` (the baseline from
`git archive` of --baseline into a temporary folder), with the same stack, catalog and seed.
Storage faults are left out of both: the baseline counted them per node and stopped the job on
each, a separate change (ADR 0010) that would blur this one. The current model is also run with
them, for the record. ETTR is a mean over replications with its 95% interval, not a timing.

    .venv/bin/python benchmarks/sim_overlap.py [--runs 8] [--days 54] [--baseline 6bb9273]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STORAGE = ("storage-outage", "storage-degraded")


def stack_doc(nodes: int, spares: int, mode: str) -> dict[str, Any]:
    """A stack both models accept: one H100 pool, Llama 3's handling (every class detected
    actively, 10-minute checkpoints of 10 s, 60 s load) and the given remediation mode."""
    classes = ("gpu-fatal", "gpu-contained", "gpu-degraded", "node-crash", "node-hang",
               "node-maintenance", "fabric-link-down", "fabric-flap", "fabric-degraded",
               "fabric-switch-down", "storage-outage", "storage-degraded", "workload")
    return {
        "cluster": {"name": "bench", "environment": "production"},
        "nodePools": [{
            "name": "h100", "accelerator": "nvidia-h100-sxm", "gpusPerNode": 8, "nodes": nodes,
            "spares": spares, "provisioning": {"kind": "static", "nodeNamePattern": "n-{index}"},
        }],
        "fabric": {"kind": "roce", "railsPerNode": 8, "nicsPerNode": 8, "linkSpeedGbps": 400,
                   "mode": "rdma-shared"},
        "storage": {"checkpoint": {"location": "/ckpt", "intervalMinutes": 10, "writeSeconds": 10,
                                   "loadSeconds": 60}},
        "scheduler": {"kind": "slurm", "queues": [{"name": "q"}]},
        "monitoring": {"grafana": False},
        "remediation": {"mode": mode, "detection": dict.fromkeys(classes, "active")},
    }


def measure(gpus: int, days: float, runs: int, seed: int, mode: str, storage: bool) -> dict[str, Any]:
    """Run in the child: uses only API that both models have."""
    import gpufleet
    from gpufleet.catalog import Catalog, load_catalog
    from gpufleet.config import StackSpec
    from gpufleet.sim import resolve, run_replications, summarize

    nodes = gpus // 8
    cat = load_catalog()
    if not storage:
        cat = Catalog(tuple(f for f in cat if f.fault_class.value not in STORAGE))
    spec = StackSpec.model_validate(stack_doc(nodes, max(1, nodes // 32), mode))
    p = resolve(spec, cat, days=days)
    m = summarize(p, run_replications(p, seed, runs, workers=2))
    return {"ettr": m.ettr.as_dict(), "interruptions_per_day": m.interruptions_per_day.as_dict(),
            "p_spares_exhausted": m.spares_exhausted.as_dict(),
            "job_capacity_availability": m.job_capacity_availability.as_dict(),
            "restart_seconds": p.restart_seconds, "spares": p.spares,
            "gpufleet_imported_from": str(Path(gpufleet.__file__).parent)}


def child(tree: Path, args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args],
                         env=env, cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def baseline_tree(commit: str, into: Path) -> Path:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "gpufleet"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--gpus", type=int, default=131_072)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", default="6bb9273")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="monitor-only")
    ap.add_argument("--storage", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sim_overlap.json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.gpus, a.days, a.runs, a.seed, a.mode, a.storage)))
        return
    common = ["--gpus", str(a.gpus), "--days", str(a.days), "--runs", str(a.runs), "--seed", str(a.seed)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_tree(a.baseline, Path(tmp))
        for label, tree, extra in (
            (f"before ({a.baseline}): latest deadline only", base, []),
            ("after (current): every deadline", ROOT, []),
            ("after (current), storage faults included", ROOT, ["--storage"]),
        ):
            for mode in (a.mode, "cordon-drain-remediate"):
                r = child(tree, [*common, "--mode", mode, *extra])
                rows.append({"model": label, "remediation_mode": mode, **r})
                e = r["ettr"]
                print(f"{label:<45} {mode:<23} ETTR {e['mean']:.4f} [{e['ci95_low']:.4f}, "
                      f"{e['ci95_high']:.4f}]  interruptions/day {r['interruptions_per_day']['mean']:.1f}  "
                      f"P(spares exhausted) {r['p_spares_exhausted']['mean']:.2f}")
    out = {"gpus": a.gpus, "days": a.days, "runs": a.runs, "seed": a.seed, "baseline": a.baseline,
           "load_average_at_end": os.getloadavg(), "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
