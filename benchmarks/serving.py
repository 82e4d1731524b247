"""Serving benchmark on loopback: 2 replicas (PyTorch, CPU) behind HAProxy, Locust load, all on this
machine's cores. Two parts, in one run:

1. Capacity: offered rates stepped up (20 users, a fixed schedule each); per step the successful
   requests per second, availability and p99. Sustained = the highest offered rate served at
   >= 99.9% availability with p99 <= 500 ms.
2. Faults side by side: a replica process killed (a crash: its port refuses at once), its host
   silent (a power loss: packets to it dropped by an nftables rule on loopback, so connections and
   checks time out), a fatal XID 79 on a replica's GPU
   (process alive) and a GPU hang without an XID (process alive, its passes never complete), each
   with the balancer checking readiness and with no health check; per run the availability over the
   run and the fault window, p99, time to recover, error budget burnt.

    .venv/bin/python benchmarks/serving.py [--rates 20,40,80,160] [--step-seconds 10]
                                           [--fault-rate 40] [--fault-seconds 60]

Prints a table and writes benchmarks/results/serving.json. Figures, not asserts. Needs haproxy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.chaos.serving import load
from gpufleet.sandbox.serving.balancer import Health
from gpufleet.sandbox.serving.local import LocalServing, write_fatal_fault, write_gpu_hang
from gpufleet.slo.serving import ServingTargets, judge, window

REPO = Path(__file__).resolve().parents[1]
USERS = 20
TARGETS = ServingTargets(availability=0.999, p99_ms=500, recover_s=10)


NFT_TABLE = f"gpufleet_bench_{os.getpid()}"


def silence(port: int) -> None:
    """A power loss, as its peers see it: packets to the replica's port are dropped (no RST, no
    answer), in a table of this run's own on loopback only. `unsilence` deletes the table."""
    rules = (f"table inet {NFT_TABLE} {{ chain input {{ type filter hook input priority 0; policy accept; "
             f'iifname "lo" tcp dport {port} drop; }}; }}')
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True, timeout=10)


def unsilence() -> None:
    subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True, timeout=10)


def run_load(
    serving: LocalServing, health: Health, rate: float, seconds: float, work: Path, fault: str | None = None
) -> dict[str, Any]:
    serving.heal()
    cfg = serving.balancer(health)
    spec = load.LoadSpec(
        f"http://{cfg.bind_ip}:{cfg.bind_port}", users=USERS, rate_per_user=rate / USERS, duration_s=seconds
    )
    records = Path(tempfile.mkdtemp(prefix="records-", dir=work))
    t0 = time.time()
    proc = load.start(spec, records, work / "locust.log")
    t_fault = None
    if fault is not None:
        time.sleep(seconds / 3)
        t_fault = time.time()
        victim = serving.members[0]
        if fault == "crash":
            victim.kill()
        elif fault == "power-loss":
            silence(victim.backend.port)
        elif fault == "hang":
            write_gpu_hang(victim.health_file)
        else:
            write_fatal_fault(victim.health_file)
    rc = load.wait(proc, spec)
    unsilence()
    if rc != 0:
        raise SystemExit(f"locust exited {rc}; see {work / 'locust.log'}")
    bins = load.bins(records, t0)
    run = (t0 + 1, t0 + seconds - 1)  # whole seconds inside the run, spawn and stop excluded
    if t_fault is None:
        w = window(bins, *run)
        return {
            "offered_rps": rate,
            "ok_rps": w.ok / (run[1] - run[0]),
            "due": w.due,
            "failed": w.failed,
            "missed": w.missed,
            "availability": w.availability,
            "p50_ms": w.p50_ms,
            "p99_ms": w.p99_ms,
        }
    checks, figures = judge(bins, run, (t_fault, t_fault + 10), TARGETS)
    return {
        "fault": fault,
        "health": health,
        "offered_rps": rate,
        **figures,
        "checks": {c.name: c.ok for c in checks},
    }


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.3f}%"


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="20,40,80,160", help="offered requests per second, comma-separated")
    ap.add_argument("--step-seconds", type=float, default=10.0)
    ap.add_argument("--fault-rate", type=float, default=40.0)
    ap.add_argument("--fault-seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "serving.json")
    args = ap.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        print(f"--rates: not a list of numbers: {args.rates!r}", file=sys.stderr)
        return 2
    problems = [
        p for r in rates for p in load.LoadSpec("http://x", USERS, r / USERS, args.step_seconds).problems()
    ]
    problems += load.LoadSpec("http://x", USERS, args.fault_rate / USERS, args.fault_seconds).problems()
    if problems or not rates:
        print("; ".join(problems) or "--rates is empty", file=sys.stderr)
        return 2
    if shutil.which("haproxy") is None or shutil.which("nft") is None:
        print("haproxy or nft is not installed (Debian packages haproxy, nftables; `make deps`)",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the power-loss case adds an nftables rule: run as root", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    try:
        return _run(args, rates, t_all)
    finally:
        unsilence()


def _run(args: argparse.Namespace, rates: list[float], t_all: float) -> int:
    with tempfile.TemporaryDirectory(prefix="gpufleet-serving-") as tmp:
        work = Path(tmp)
        with LocalServing(work / "serving") as serving:
            capacity = []
            for rate in rates:
                capacity.append(run_load(serving, "ready", rate, args.step_seconds, work))
                c = capacity[-1]
                print(
                    f"offered {rate:>6.0f}/s  ok {c['ok_rps']:>7.1f}/s  "
                    f"availability {_pct(c['availability'])}"
                    f"  p99 {_num(c['p99_ms'])} ms",
                    flush=True,
                )
            faults = []
            for fault in ("crash", "power-loss", "xid79", "hang"):
                for health in ("ready", "none"):
                    faults.append(run_load(serving, health, args.fault_rate, args.fault_seconds, work, fault))
                    f = faults[-1]
                    print(
                        f"{fault:10} check={health:5}  availability {_pct(f['availability'])}  window "
                        f"{_pct(f['window_availability'])}  p99 {_num(f['window_p99_ms'])} ms  recover "
                        f"{_num(f['recover_seconds'])} s  budget burnt {_num(f['budget_burnt'])}x",
                        flush=True,
                    )
    sustained = max(
        (
            c["offered_rps"]
            for c in capacity
            if (c["availability"] or 0) >= 0.999 and (c["p99_ms"] or 1e9) <= TARGETS.p99_ms
        ),
        default=None,
    )
    print(f"\nsustained (>= 99.9% and p99 <= {TARGETS.p99_ms:g} ms): {sustained} requests/s offered")
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "serving",
                "machine": {
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                },
                "setup": {"replicas": 2, "users": USERS, "balancer": "haproxy", "where": "loopback"},
                "capacity": capacity,
                "sustained_rps": sustained,
                "faults": faults,
                "targets": TARGETS.__dict__,
                "total_seconds": time.monotonic() - t_all,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
