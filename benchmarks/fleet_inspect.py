"""Fleet inspection benchmark (issue 16): planning and deciding a sweep of a 1,250-node fleet from
synthetic observations (target <= 1 s), and a light (and full) sweep of a running sandbox (target
<= 60 s).

    .venv/bin/python benchmarks/fleet_inspect.py                    # planning only
    .venv/bin/python benchmarks/fleet_inspect.py --sandbox sandbox  # + sweeps of a running sandbox (root)

The 1,250-node figure times the pure part of a sweep on SIMULATED observations
(gpufleet.fleet.inspect.synthetic): the plan (who runs heavy checks, collective pairs), every check
of every node, the pool references, the lemon rule over 6 earlier sweeps of history, and the rows
of the report; it does not time reading nodes. `slurm_read_1250` times what `inspect --slurm` adds
before that (ADR 0088): parsing sinfo's lines for 1,250 nodes, reading and validating the 1,250
files the nodes published (written here from the same synthetic observations, to a local folder:
a shared file system's latency is not in it) and joining them with Slurm's view. The sandbox
figures time the real command (`gpufleet inspect`), subprocess start included. Prints a table and writes
benchmarks/results/inspect.json. Figures, not asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.fleet.inspect import history as H
from gpufleet.fleet.inspect.checks import Pins
from gpufleet.fleet.inspect.plan import plan_sweep
from gpufleet.fleet.inspect.sweep import run_sweep
from gpufleet.fleet.inspect.synthetic import Degradations, fleet_runs
from gpufleet.fleet.inspect.thresholds import load_thresholds

REPO = Path(__file__).resolve().parents[1]
PLAN_TARGET_S = 1.0
SWEEP_TARGET_S = 60.0


def plan_1250(repeats: int, history_runs: int = 6) -> dict[str, Any]:
    nodes = [f"gpu-{i:04d}" for i in range(1250)]
    deg = Degradations(slow="gpu-0100", ecc="gpu-0500", flap="gpu-0900")
    runs = list(fleet_runs(nodes, history_runs + 1, seed=1, deg=deg))
    rules, _ = xid_policy(load_catalog(), {})
    thresholds = load_thresholds()
    past: list[H.NodeRecord] = []
    for i, obs in enumerate(runs[:-1]):
        past += run_sweep(run_id=f"h{i}", stack="bench", level="full", at=obs[0].at, observations=obs,
                          past=past, thresholds=thresholds, xid_rules=rules, pins={"gpu": Pins()}).records
    last = runs[-1]
    plan_s, sweep_s = [], []
    lemons: list[str] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_sweep([(o.node, o.sched_state) for o in last], "full")
        plan_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = run_sweep(run_id="bench", stack="bench", level="full", at=last[0].at, observations=last,
                        past=past, thresholds=thresholds, xid_rules=rules, pins={"gpu": Pins()})
        sweep_s.append(time.perf_counter() - t0)
        lemons = [lm.node for lm in out.lemons]
    return {
        "nodes": len(nodes), "history_records": len(past), "repeats": repeats, "pairs": len(plan.pairs),
        "plan_seconds_median": statistics.median(plan_s),
        "plan_and_decide_seconds_median": statistics.median(sweep_s),
        "plan_and_decide_seconds_max": max(sweep_s),
        "target_seconds": PLAN_TARGET_S, "lemons": lemons,
        "observations": "synthetic (gpufleet.fleet.inspect.synthetic, seed 1)",
    }


def slurm_read_1250(repeats: int) -> dict[str, Any]:
    from gpufleet.config.accelerators import AcceleratorModel
    from gpufleet.fleet.inspect import slurm_cluster as S
    from gpufleet.fleet.inspect.cluster import PoolShape

    nodes = [f"gpu-{i:04d}" for i in range(1250)]
    obs = next(iter(fleet_runs(nodes, 1, seed=1, deg=Degradations())))
    sinfo = "".join(f"{n}|idle|none|Unknown|train*|gpu\n" for n in nodes)
    pools = [S.SlurmPool("gpu", PoolShape(AcceleratorModel.H100_SXM, 8))]
    read_s: list[float] = []
    judged = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for o in obs:
            S.write_published(o, folder)
        for _ in range(repeats):
            t0 = time.perf_counter()
            slurm_nodes = S.parse_slurm_nodes(sinfo)
            texts, unreadable = S.read_published(folder, sorted(slurm_nodes))
            got = S.observations_from_slurm(slurm_nodes, texts, unreadable, pools, now=obs[0].at + 60)
            read_s.append(time.perf_counter() - t0)
            judged = sum(1 for o in got if not o.unknown)
    return {"nodes": len(nodes), "repeats": repeats,
            "read_and_join_seconds_median": statistics.median(read_s),
            "read_and_join_seconds_max": max(read_s), "nodes_with_a_reading": judged,
            "target_seconds": PLAN_TARGET_S, "folder": "local temporary folder"}


def sandbox_sweep(stack: str, level: str, history: Path) -> dict[str, Any]:
    cmd = [str(Path(sys.executable).parent / "gpufleet"), "inspect", "--stack", stack, "--level", level,
           "--format", "json", "--history", str(history)]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    wall = time.monotonic() - t0
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}
    return {"level": level, "command": " ".join(["gpufleet", *cmd[1:]]), "exit_code": res.returncode,
            "wall_seconds": round(wall, 3), "sweep_seconds": doc.get("wall_seconds"),
            "nodes": len(doc.get("nodes", [])), "summary": doc.get("summary"),
            "target_seconds": SWEEP_TARGET_S,
            "stderr": res.stderr.strip()[-500:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sandbox", help="also sweep this stack's running sandbox (needs root)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "inspect.json")
    a = ap.parse_args()
    result: dict[str, Any] = {"host": {"python": platform.python_version(), "cpus": os.cpu_count()},
                              "plan_1250": plan_1250(a.repeats),
                              "slurm_read_1250": slurm_read_1250(a.repeats)}
    p = result["plan_1250"]
    print(f"1,250 nodes: plan {p['plan_seconds_median'] * 1000:.1f} ms, plan+decide "
          f"{p['plan_and_decide_seconds_median']:.3f} s median "
          f"(max {p['plan_and_decide_seconds_max']:.3f} s; "
          f"target <= {PLAN_TARGET_S} s); lemons {p['lemons']}")
    r = result["slurm_read_1250"]
    print(f"1,250 nodes, --slurm's reading: sinfo + {r['nodes']} published files + join "
          f"{r['read_and_join_seconds_median']:.3f} s median (max {r['read_and_join_seconds_max']:.3f} s; "
          f"{r['nodes_with_a_reading']} nodes with a reading)")
    if a.sandbox:
        with tempfile.TemporaryDirectory() as tmp:
            result["sandbox"] = [sandbox_sweep(a.sandbox, lvl, Path(tmp)) for lvl in ("light", "full")]
        for s in result["sandbox"]:
            print(f"sandbox {a.sandbox} {s['level']}: {s['wall_seconds']:.1f} s wall ({s['nodes']} nodes, "
                  f"{s['summary']}, exit {s['exit_code']}; target <= {SWEEP_TARGET_S} s)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
