"""Drill 3 benchmark, "scheduler state lost" on the Slurm sandbox: RPO and RTO of
`gpufleet drill run scheduler-state-lost` (median of `--runs`), the training steps that ran while
slurmctld was gone, and what the state backups cost (the controller's pause for the copy, the
scratch slurmctld's load, a whole round, the archive's size).

    .venv/bin/python benchmarks/scheduler_drill.py [--runs 3] [--stack sandbox-storage]
    .venv/bin/python benchmarks/scheduler_drill.py --drill scheduler-host-lost \
        --out benchmarks/results/scheduler-host-lost.json

`--drill scheduler-host-lost` brings the stack's storage sandbox up first: the backup job copies
each verified backup to its backup bucket, and the drill restores from that copy after the
controller's host is lost with its own backups (ADR 0069). The copy's time is reported too.

One Slurm sandbox (a private state root and fault ledger, so it never meets a sandbox someone else
runs), the drill played `--runs` times on it one after the other. Prints a line per run and writes
benchmarks/results/scheduler-drill.json. Figures, not asserts; the load average before each run is
recorded with it (the machine may be shared).
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

from gpufleet.core.jsonl import read_objects
from gpufleet.core.sandbox_contract import read_state
from gpufleet.core.slurm_state_backups import backup_dir, list_evidence

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "scheduler-drill.json"
BIN = Path(sys.executable).parent


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _drill(env: dict[str, str], stack: str, journal: Path, drill: str) -> dict[str, Any]:
    t0 = time.monotonic()
    run = subprocess.run([str(BIN / "gpufleet"), "drill", "run", drill, "--stack", stack,
                          "--journal", str(journal)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    out: dict[str, Any] = {"exit": run.returncode, "wall_s": round(time.monotonic() - t0, 1),
                           "load_before": os.getloadavg()[0]}
    try:
        doc = json.loads(journal.read_text())
        verdict = next(p["output"] for p in doc["steady_states"]["after"]["probes"]
                       if p["activity"]["name"] == "drill-within-targets")
    except (OSError, ValueError, StopIteration, KeyError, TypeError) as e:
        out["error"] = f"{type(e).__name__}: {e}; {run.stdout[-1500:]} {run.stderr[-1500:]}"
        return out
    during = [n for n in verdict.get("notes", []) if "ran while slurmctld was down" in n]
    out.update(outcome=verdict["outcome"], rpo_s=verdict["rpo_seconds"], rto_s=verdict["rto_seconds"],
               steps_lost=verdict["steps_lost"], notes=verdict.get("notes", []),
               steps_during_outage=int(during[0].split()[0]) if during else 0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stack", default="sandbox-storage")
    p.add_argument("--drill", default="scheduler-state-lost",
                   choices=("scheduler-state-lost", "scheduler-host-lost"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="drill3-bench-"))
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(root / "ledger.jsonl")}
    gf = str(BIN / "gpufleet")
    if args.drill == "scheduler-host-lost":
        storage = subprocess.run([gf, "sandbox", "up", "--storage", "--stack", args.stack], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=600)
        if storage.returncode != 0:
            raise SystemExit(f"storage sandbox up failed:\n{storage.stdout}\n{storage.stderr}")
    t0 = time.monotonic()
    up = subprocess.run([gf, "sandbox", "up", "--stack", args.stack], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=400)
    up_s = round(time.monotonic() - t0, 1)
    shipped: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    backups: list[Any] = []
    try:
        if up.returncode != 0:
            raise SystemExit(f"sandbox up failed:\n{up.stdout}\n{up.stderr}")
        for i in range(args.runs):
            if i:
                # As the game-day does before each experiment: the steady state restored first (the
                # restored controller lists idle nodes as "unknown" until their slurmd register
                # again, and the next drill's safety control refuses a cluster that is not steady).
                steady = subprocess.run([gf, "chaos", "steady", "--stack", args.stack, "--heal"], env=env,
                                        cwd=REPO, capture_output=True, text=True, timeout=300)
                if steady.returncode != 0:
                    print(f"run {i + 1}: no steady state: {steady.stdout[-800:]}", flush=True)
            r = _drill(env, args.stack, root / f"journal-{i}.json", args.drill)
            runs.append(r)
            err = f" ({r['error']})" if "error" in r else ""
            print(f"run {i + 1}: {r.get('outcome')} RPO {r.get('rpo_s')} s RTO {r.get('rto_s')} s, "
                  f"{r.get('steps_during_outage')} steps while slurmctld was down, steps lost "
                  f"{r.get('steps_lost')}, load {r['load_before']:.1f}{err}", flush=True)
        state = read_state(args.stack, root)
        backups = list_evidence(backup_dir(state))
        lines = read_objects(Path(state.base_dir) / "slurm" / "state-backup.jsonl")
        shipped = [e["offsite"] for e in lines if e.get("offsite")]
    finally:
        subprocess.run([gf, "chaos", "revert"], env=env, cwd=REPO, capture_output=True, timeout=120)
        subprocess.run([gf, "sandbox", "down", "--stack", args.stack], env=env, cwd=REPO, capture_output=True,
                       timeout=300)
    ok = [b for b in backups if b.verified]
    summary = {
        "rpo_s": _med([r["rpo_s"] for r in runs if r.get("rpo_s") is not None]),
        "rto_s": _med([r["rto_s"] for r in runs if r.get("rto_s") is not None]),
        "pass": sum(r.get("outcome") == "PASS" for r in runs),
        "runs": len(runs),
        "steps_during_outage": _med([r["steps_during_outage"] for r in runs if "steps_during_outage" in r]),
        "backup_paused_s": _med([b.paused_seconds for b in ok]),
        "backup_scratch_load_s": _med([b.load_seconds for b in ok if b.load_seconds is not None]),
        "backup_round_s": _med([b.seconds for b in ok]),
        "backup_bytes": _med([float(b.bytes) for b in ok]),
        "backups_kept": len(backups),
        "backups_failed_kept": len(backups) - len(ok),
        "up_s": up_s,
        "offsite_copies": len(shipped),
        "offsite_copies_verified": sum(bool(s.get("verified")) for s in shipped),
        "offsite_copy_s": _med([float(s["seconds"]) for s in shipped if "seconds" in s]),
    }
    doc = {"stack": args.stack, "drill": args.drill, "host": platform.node(), "cpus": os.cpu_count(),
           "at": time.time(), "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
