"""Diagnostic bundle benchmark (issue 16): how long a bundle of a sandbox node takes and how big it
is, the way the node-health check collects it before a drain (`python -m gpufleet.fleet.bundle`
inside the node's network namespace, interpreter start included), and the archive's own cost
(writing and verifying a bundle at the size caps).

    .venv/bin/python benchmarks/bundles.py                     # the archive only
    .venv/bin/python benchmarks/bundles.py --sandbox sandbox   # + a running sandbox's nodes (root)

Prints a table and writes benchmarks/results/bundles.json, with the machine's load average beside
the figures (a shared 2-core machine: a figure under load is not the code's). Figures, not asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.core.sandbox_contract import read_state
from gpufleet.fleet.bundle.archive import members, read_manifest, verify, write_bundle
from gpufleet.fleet.bundle.caps import MIB, SANDBOX_CAPS
from gpufleet.fleet.bundle.model import Manifest
from gpufleet.fleet.bundle.runner import Collector, Output

REPO = Path(__file__).resolve().parents[1]


def archive_figures(repeats: int) -> dict[str, Any]:
    """Write and verify a bundle of four 16 MiB members (the total cap) of incompressible bytes: the
    worst case for gzip. Wall time and this process's CPU time (the wall time is the machine's load)."""
    cs = [Collector(f"c{i}", f"c{i}.bin", ["bench"]) for i in range(4)]
    outs = {c.name: Output(os.urandom(16 * MIB), "ok", 0, 0.0) for c in cs}
    records, files = members(cs, outs, SANDBOX_CAPS)
    write_s, verify_s, write_cpu, verify_cpu = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            at = time.time()
            manifest = Manifest(node=f"n{i}", stack=None, source="bench", trigger="benchmark", started_at=at,
                                finished_at=at, caps=SANDBOX_CAPS, members=records)
            t0, c0 = time.perf_counter(), time.process_time()
            path = write_bundle(Path(d), manifest, files)
            write_s.append(time.perf_counter() - t0)
            write_cpu.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            _, problems = verify(path)
            verify_s.append(time.perf_counter() - t0)
            verify_cpu.append(time.process_time() - c0)
            assert problems == [], problems
    return {"members": 4, "bytes": sum(len(v) for v in files.values()), "repeats": repeats,
            "write_s_median": round(statistics.median(write_s), 3),
            "verify_s_median": round(statistics.median(verify_s), 3),
            "write_cpu_s_median": round(statistics.median(write_cpu), 3),
            "verify_cpu_s_median": round(statistics.median(verify_cpu), 3)}


def sandbox_figures(stack: str, repeats: int) -> dict[str, Any]:
    state = read_state(stack)
    state_file = Path(state.base_dir).parent / "state.json"
    nodes = [n for n in state.nodes if n.role in ("compute", "spare")]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            node = nodes[i % len(nodes)]
            argv = ["ip", "netns", "exec", node.netns, sys.executable, "-m", "gpufleet.fleet.bundle",
                    "--state-file", str(state_file), "--node", node.name, "--out", d,
                    "--trigger", "benchmark", "--detected-at", f"{time.time():.3f}"]
            load = os.getloadavg()[0]
            t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
            if res.returncode != 0:
                raise SystemExit(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr}")
            path = Path(res.stdout.split(" (")[0])
            m = read_manifest(path)
            runs.append({"node": node.name, "hook_wall_s": round(wall, 3), "hook_cpu_s": round(cpu, 3),
                         "collect_s": round(m.finished_at - m.started_at, 3), "bytes_gz": path.stat().st_size,
                         "bytes_kept": m.total_bytes, "load1": round(load, 2),
                         "not_ok": [f"{x.collector}: {x.status}" for x in m.members if x.status != "ok"],
                         "slowest": max(m.members, key=lambda x: x.duration_s).collector})
    return {
        "stack": stack, "repeats": repeats, "runs": runs,
        "hook_wall_s_median": round(statistics.median(r["hook_wall_s"] for r in runs), 3),
        "hook_cpu_s_median": round(statistics.median(r["hook_cpu_s"] for r in runs), 3),
        "collect_s_median": round(statistics.median(r["collect_s"] for r in runs), 3),
        "bytes_gz_median": int(statistics.median(r["bytes_gz"] for r in runs)),
        "caps": SANDBOX_CAPS.model_dump(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sandbox", metavar="STACK", help="also collect bundles of this running sandbox's nodes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bundles.json")
    args = p.parse_args()
    doc: dict[str, Any] = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                       "load1_at_start": round(os.getloadavg()[0], 2)},
                           "command": " ".join(["benchmarks/bundles.py", *sys.argv[1:]]),
                           "archive": archive_figures(args.repeats)}
    a = doc["archive"]
    print(f"archive of {a['bytes'] / MIB:.0f} MiB (incompressible): write {a['write_s_median']} s "
          f"({a['write_cpu_s_median']} CPU s), verify {a['verify_s_median']} s "
          f"({a['verify_cpu_s_median']} CPU s) (median of {a['repeats']})")
    if args.sandbox:
        s = sandbox_figures(args.sandbox, args.repeats)
        doc["sandbox"] = s
        for r in s["runs"]:
            print(f"  {r['node']}: hook {r['hook_wall_s']} s, {r['hook_cpu_s']} CPU s (collection "
                  f"{r['collect_s']} s), "
                  f"{r['bytes_gz']} bytes gz, load {r['load1']}, slowest {r['slowest']}"
                  + (f", not ok: {r['not_ok']}" if r["not_ok"] else ""))
        print(f"sandbox {s['stack']}: hook {s['hook_wall_s_median']} s median "
              f"({s['hook_cpu_s_median']} CPU s), collection {s['collect_s_median']} s, "
              f"{s['bytes_gz_median']} bytes")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
