"""Storage sandbox benchmark: Ceph bring-up time (to HEALTH_OK and to a first checkpoint), resident
memory of every daemon, boto3 checkpoint write/read throughput on radosgw, the drills' RPO/RTO
(checkpoint-bucket-lost and osd-lost; metadata-engine-lost on a stack with JuiceFS), and `down`
time; medians of `--runs` runs. On a stack with storage.juicefs also: the JuiceFS bring-up (two
Redis, `juicefs format`, the mount) and the same checkpoint written and read back on the mount.
With `--thrash-minutes N` (Ceph-only stacks), the OSD thrasher runs N minutes after the drills:
each change's time to clean (median, p90, max, and pooled over the runs), the S3 oracle's reads,
writes and errors (accounted for or not), checkpoints lost or corrupt.

    .venv/bin/python benchmarks/storage.py [--runs 3] [--stack sandbox-storage] [--no-drill]
    .venv/bin/python benchmarks/storage.py --runs 1 --no-drill --thrash-minutes 3 \
        --out benchmarks/results/storage-thrash.json
    .venv/bin/python benchmarks/storage.py --stack sandbox-storage-juicefs
    .venv/bin/python benchmarks/storage.py --stack sandbox-storage-juicefs --training-job \
        --out benchmarks/results/sandbox-storage-juicefs-training-job.json
    .venv/bin/python benchmarks/storage.py --stack sandbox-storage-s3 --training-job \
        --out benchmarks/results/sandbox-storage-s3-training-job.json

With `--training-job` (a stack that checkpoints on JuiceFS or straight to S3), the Slurm sandbox
comes up after the storage sandbox with its PyTorch training job checkpointing on the volume
(ADR 0068) or in the checkpoint bucket (ADR 0070), and the drills judge that job: they start once a
verified backup (a metadata dump, or a copy in the backup bucket) holds one of its checkpoints.

Each run gets its own state root (a temporary folder under /var/tmp: BlueStore needs a file system
with O_DIRECT, which tmpfs lacks) and fault ledger, so it never meets a sandbox someone else runs.
Prints a table and writes benchmarks/results/storage.json (benchmarks/results/<stack>.json for
another stack). Figures, not asserts. The machine may be
shared: the load average before each run is recorded with it.
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

from gpufleet.config import load_named_stack
from gpufleet.core.fs_checkpoints import FsCheckpointStore
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.sandbox.processes import rss_bytes
from gpufleet.sandbox.storage.ceph import StorageUpOptions, storage_down, storage_up

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
MIB = 1024 * 1024


def throughput(state: Any, size_mib: int = 64, on_juicefs: bool = False) -> dict[str, float]:
    """One checkpoint of `size_mib` MiB in 4 shards through boto3 (multipart above 16 MiB), or on
    the JuiceFS mount (each file fsync'd; read back through the mount, whose client caches what it
    wrote): MiB/s to write it (manifest last) and to read and verify it back by sha256."""
    store: Any
    if on_juicefs:
        store = FsCheckpointStore(Path(state.juicefs.mountpoint) / "bench")
    else:
        assert state.checkpoint_bucket is not None
        store = store_for(state, state.checkpoint_bucket, "bench/")
    shards = {f"shard-{i}.bin": os.urandom(size_mib * MIB // 4) for i in range(4)}
    t0 = time.monotonic()
    manifest = store.put((9, 0, 1), shards, b'{"bench": true}', time.time())
    write_s = time.monotonic() - t0
    t0 = time.monotonic()
    problems = store.verify(manifest)
    read_s = time.monotonic() - t0
    if problems:
        raise RuntimeError(f"the benchmark checkpoint does not verify: {problems}")
    store.delete((9, 0, 1))
    return {"write_mib_s": round(size_mib / write_s, 1), "read_verify_mib_s": round(size_mib / read_s, 1)}


DRILLS = ("checkpoint-bucket-lost", "osd-lost")
# On a stack that checkpoints to JuiceFS the bucket drills have nothing of the writer's to restore.
JUICEFS_DRILLS = ("metadata-engine-lost",)


def drill(root: Path, stack: str, name: str) -> dict[str, Any]:
    journal = root / f"drill-{name}.json"
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(root / "ledger.jsonl")}
    argv = [
        str(Path(sys.executable).parent / "gpufleet"),
        "drill",
        "run",
        name,
        "--stack",
        stack,
        "--journal",
        str(journal),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    from gpufleet.cli.drill_cmds import verdict_from_journal

    verdict = verdict_from_journal(json.loads(journal.read_text())) if journal.exists() else None
    if verdict is None:
        return {"outcome": None, "exit": proc.returncode, "output": proc.stdout[-2000:] + proc.stderr[-2000:]}
    return {
        "outcome": verdict.outcome.value,
        "integrity": {c.name: c.detail for c in verdict.checks}.get("integrity"),
        "notes": list(verdict.notes),
        "rpo_s": verdict.rpo_seconds,
        "rto_s": verdict.rto_seconds,
        "steps_lost": verdict.steps_lost,
        "resumed_after_s": verdict.resumed_after_seconds,
        "exit": proc.returncode,
    }


def training_job_up(root: Path, stack: str) -> tuple[float, str]:
    """`gpufleet sandbox up` (the Slurm sandbox and its training job on the JuiceFS volume or straight
    on S3) under `root`, then a wait for a verified backup that holds the job's checkpoint: a
    metadata dump taken after its first save (JuiceFS), or a verified copy of one of its checkpoints
    in the backup bucket (S3). Returns the bring-up seconds and where the job checkpoints."""
    from gpufleet.core.jsonl import read_objects
    from gpufleet.core.s3 import read_location
    from gpufleet.core.sandbox_contract import read_state
    from gpufleet.core.storage_contract import read_storage_state

    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root)}
    t0 = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "gpufleet"), "sandbox", "up", "--stack", stack],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox up failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    up_s = time.monotonic() - t0
    sandbox = read_state(stack, root)
    assert sandbox.training_events is not None and sandbox.checkpoint_dir is not None
    storage = read_storage_state(stack, root)
    where = sandbox.checkpoint_dir
    if sandbox.checkpoint_s3 is not None:
        loc = read_location(Path(sandbox.checkpoint_s3))
        where = loc.url
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        saves = [e for e in read_objects(Path(sandbox.training_events)) if e.get("event") == "checkpoint"]
        if sandbox.checkpoint_s3 is not None:
            copies = [e for e in read_objects(storage.events_file("backup"))
                      if e.get("event") == "backup" and e.get("job_prefix") == loc.prefix]
            if saves and copies:
                return round(up_s, 2), where
        else:
            dumps = [e for e in read_objects(storage.events_file("metadata-backup")) if e.get("verified")]
            if saves and any(float(d["taken_at"]) > float(saves[0]["t"]) for d in dumps):
                return round(up_s, 2), where
        time.sleep(1)
    raise RuntimeError("no verified backup holds a checkpoint of the training job within 180 s")


def thrash(root: Path, stack: str, minutes: float, seed: int) -> dict[str, Any]:
    """The OSD thrasher (gpufleet.chaos.storage.thrash) in this process, on its own ledger."""
    from gpufleet.chaos import engine
    from gpufleet.chaos.storage.actions import osd_thrash

    cfg = {
        "gpufleet_backend": "storage",
        "gpufleet_stack": stack,
        "gpufleet_ledger": str(root / "thrash-ledger.jsonl"),
        "gpufleet_sandbox_root": str(root),
    }
    engine.end_runs()
    try:
        report = osd_thrash(minutes=minutes, max_changes=500, seed=seed, configuration=cfg)
    except Exception as e:  # a figure that could not be measured is said, never invented
        return {"outcome": None, "error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        engine.revert(cfg)
        engine.end_runs()
    keep = ("outcome", "problems", "seed", "limits", "seconds", "changes", "moves", "time_to_clean_s",
            "time_to_active_s", "not_clean_reachable", "oracle", "writer_failures", "checkpoints", "timeline")
    return {k: report[k] for k in keep}


def one(
    stack: str,
    settle_s: float,
    with_drill: bool,
    thrash_minutes: float = 0.0,
    seed: int = 0,
    training_job: bool = False,
) -> dict[str, Any]:
    spec = load_named_stack(stack, REPO / "stacks")
    load_before = round(os.getloadavg()[0], 2)
    os.makedirs("/var/tmp", exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="storage-bench-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        try:
            rec, timings = storage_up(stack, spec, StorageUpOptions(timeout_s=300), root=root)
            up_s = time.monotonic() - t0
            state = rec.state
            time.sleep(settle_s)
            rss = {p.name: round(rss_bytes(p.pid) / MIB, 1) for p in state.processes}
            speed = throughput(state)
            if state.juicefs is not None:
                speed.update({f"jfs_{k}": v for k, v in throughput(state, on_juicefs=True).items()})
            names = JUICEFS_DRILLS if state.juicefs is not None else DRILLS
            job: dict[str, Any] | None = None
            if training_job:
                job_up_s, job_folder = training_job_up(root, stack)
                job = {"up_s": job_up_s, "folder": job_folder}
            drills = {name: drill(root, stack, name) for name in names} if with_drill else {}
            thrashed = None
            if thrash_minutes > 0 and state.juicefs is None:
                thrashed = thrash(root, stack, thrash_minutes, seed)
        finally:
            if training_job:
                from gpufleet.sandbox.down import down

                down(stack, root)  # the Slurm sandbox alone: the storage's down is timed below
            t1 = time.monotonic()
            report = storage_down(stack, root)
            down_s = time.monotonic() - t1
        return {
            "stack": stack,
            "load_before": load_before,
            "up_s": round(up_s, 2),
            "marks_s": timings.marks,
            "rss_mib": rss,
            "rss_total_mib": round(sum(rss.values()), 1),
            "rss_ceph_mib": round(sum(v for k, v in rss.items() if k.startswith(("ceph-", "radosgw"))), 1),
            "rss_juicefs_mib": round(sum(v for k, v in rss.items() if k.startswith(("redis", "juicefs"))), 1),
            # Both Redis servers, `juicefs format` and the mount answering (after the monitoring).
            "juicefs_up_s": round(timings.marks["juicefs"] - timings.marks["monitoring"], 2)
            if "juicefs" in timings.marks
            else None,
            **speed,
            "training_job": job,
            "drills": drills,
            "thrash": thrashed,
            "down_s": round(down_s, 2),
            "down_clean": bool(report and report.clean),
        }


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
    return round(statistics.median(values), 2) if values else None


def thrash_summary(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Every change's time to clean pooled over the runs (median, p90, max), and the runs' totals."""
    from gpufleet.chaos.storage.thrash_policy import distribution

    if not reports:
        return None
    rows = [row for t in reports for row in t.get("timeline", [])]
    clean = [float(r["to_clean_s"]) for r in rows if r["clean_reachable"] and r["to_clean_s"] is not None]
    active = [float(r["to_active_s"]) for r in rows if r["to_active_s"] is not None]
    oracle = [t.get("oracle", {}) for t in reports]
    return {
        "outcomes": [t.get("outcome") for t in reports],
        "changes": sum(int(t.get("changes") or 0) for t in reports),
        "time_to_clean_s": distribution(clean),
        "time_to_active_s": distribution(active),
        "oracle_writes": sum(int(o.get("writes") or 0) for o in oracle),
        "oracle_reads": sum(int(o.get("reads") or 0) for o in oracle),
        "oracle_mismatches": sum(len(o.get("mismatches") or []) for o in oracle),
        "s3_errors": sum(int(o.get("errors") or 0) for o in oracle),
        "s3_errors_unaccounted": sum(len(o.get("unaccounted") or []) for o in oracle)
        + sum(len((t.get("writer_failures") or {}).get("unaccounted") or []) for t in reports),
        "checkpoints_lost": sum(len((t.get("checkpoints") or {}).get("lost") or []) for t in reports),
        "checkpoints_corrupt": sum(len((t.get("checkpoints") or {}).get("corrupt") or []) for t in reports),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stack", default="sandbox-storage")
    p.add_argument("--settle", type=float, default=10.0, help="seconds after up before reading RSS")
    p.add_argument("--no-drill", action="store_true")
    p.add_argument("--thrash-minutes", type=float, default=0.0, help="run the OSD thrasher this long")
    p.add_argument("--seed", type=int, default=20261205, help="the thrasher's seed (run i uses seed + i)")
    p.add_argument("--out", type=Path, default=None, help="the JSON (default: results/<stack>.json)")
    p.add_argument("--training-job", action="store_true",
                   help="the Slurm sandbox's training job on the JuiceFS volume or straight on S3, judged "
                   "by the drills")
    args = p.parse_args()
    location = load_named_stack(args.stack, REPO / "stacks").storage.checkpoint.location
    if args.training_job and not location.startswith(("juicefs://", "s3://")):
        p.error(f"--training-job: stack {args.stack} checkpoints to {location!r}, neither on JuiceFS nor S3")
    runs = []
    for i in range(args.runs):
        r = one(args.stack, args.settle, not args.no_drill, args.thrash_minutes, args.seed + i,
                args.training_job)
        runs.append(r)
        said = "; ".join(
            f"{n} {d.get('outcome')} RPO {d.get('rpo_s')} s RTO {d.get('rto_s')} s"
            for n, d in r["drills"].items()
        )
        jfs = (
            f"JuiceFS up {r['juicefs_up_s']} s, on the mount write {r.get('jfs_write_mib_s')} MiB/s, "
            f"read+verify {r.get('jfs_read_verify_mib_s')} MiB/s, "
            if r["juicefs_up_s"] is not None
            else ""
        )
        print(
            f"run {i + 1}: up {r['up_s']} s (HEALTH_OK at {r['marks_s'].get('health_ok')} s), {jfs}"
            f"RSS {r['rss_total_mib']} MiB (Ceph {r['rss_ceph_mib']}), write {r['write_mib_s']} MiB/s, "
            f"read+verify {r['read_verify_mib_s']} MiB/s, "
            + (f"training job up {r['training_job']['up_s']} s, " if r.get("training_job") else "")
            + f"{said}, down {r['down_s']} s, "
            f"load {r['load_before']}",
            flush=True,
        )
        if r["thrash"] is not None:
            t = r["thrash"]
            print(f"run {i + 1} thrash: {t.get('outcome')} {t.get('changes')} changes, time to clean "
                  f"{t.get('time_to_clean_s')}, oracle {t.get('oracle', {}).get('writes')} writes "
                  f"{t.get('oracle', {}).get('reads')} reads {t.get('oracle', {}).get('errors')} errors "
                  f"({len(t.get('oracle', {}).get('unaccounted', []))} unaccounted), problems "
                  f"{t.get('problems') or t.get('error')}", flush=True)
    per_drill = {n: [r["drills"][n] for r in runs if n in r["drills"]] for n in (*DRILLS, *JUICEFS_DRILLS)}
    summary = {
        "up_s": median(runs, "up_s"),
        "health_ok_s": median([r["marks_s"] for r in runs], "health_ok"),
        "rss_total_mib": median(runs, "rss_total_mib"),
        "rss_ceph_mib": median(runs, "rss_ceph_mib"),
        "write_mib_s": median(runs, "write_mib_s"),
        "read_verify_mib_s": median(runs, "read_verify_mib_s"),
        "juicefs_up_s": median(runs, "juicefs_up_s"),
        "rss_juicefs_mib": median(runs, "rss_juicefs_mib"),
        "jfs_write_mib_s": median(runs, "jfs_write_mib_s"),
        "jfs_read_verify_mib_s": median(runs, "jfs_read_verify_mib_s"),
        "drills": {
            n: {
                "rpo_s": median(ds, "rpo_s"),
                "rto_s": median(ds, "rto_s"),
                "steps_lost": median(ds, "steps_lost"),
                "outcomes": [d.get("outcome") for d in ds],
            }
            for n, ds in per_drill.items()
            if ds
        },
        "training_job_up_s": median([r["training_job"] for r in runs if r.get("training_job")], "up_s"),
        "down_s": median(runs, "down_s"),
        "thrash": thrash_summary([r["thrash"] for r in runs if r.get("thrash")]),
    }
    print(json.dumps(summary, indent=2))
    default = RESULTS_DIR / ("storage.json" if args.stack == "sandbox-storage" else f"{args.stack}.json")
    results = args.out or default
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(
        json.dumps(
            {
                "benchmark": "storage",
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
                "command": " ".join(["benchmarks/storage.py", *sys.argv[1:]]),
                "median": summary,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
