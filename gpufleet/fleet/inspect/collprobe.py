"""`python -m gpufleet.fleet.inspect.collprobe`: a node's collective bus bandwidth, measured by
`--ranks` processes on this host running torch.distributed all_reduce; the Kubernetes gate's
performance pod (ADR 0083, docs/fleet-upgrade.md "The performance pod").

- Backend: NCCL on the node's GPUs when CUDA is there (one rank per GPU; `rccl_...` on a ROCm
  build of torch, whose NCCL backend is RCCL), gloo on the CPU otherwise (the sandbox's kubelet
  nodes). The metric it reports is named after the backend, so a CPU figure is never compared with
  a GPU SKU's published one.
- The figure: the bus bandwidth of the fastest of `--iters` timed all_reduce operations (after
  `--warmup` untimed ones), busbw = algbw * 2 (n - 1) / n, the factor nccl-tests gives for
  all_reduce (nccl-tests doc/PERFORMANCE.md), algbw = bytes / seconds. nccl-tests reports the mean
  of its iterations; the fastest is asked here because the probe asks what the node can do, and an
  operation that another process delayed on a shared host says nothing of the node. On these 2-core
  machines (gloo, 64 MiB, 2 ranks) the fastest of 60 spread 1.70 to 1.94 GB/s over 8 runs, the
  median of 20 0.78 to 1.27.
- The ranks meet on 127.0.0.1 (a pod's own loopback); the whole run is bounded by `--deadline`.
- Each rank chooses the backend itself (`choose_backend`), from what torch sees on this host, the
  same on every rank; rank 0 reports it with its times. The parent never imports torch: that import
  costs about 1.3 s warm on these machines, which would run serially before the ranks start.

Prints one JSON line {"perf": {metric: GB/s}, "backend", "ranks", "sizeBytes", "iters", "seconds"}
(the contract a site's own performance pod also follows, gpufleet.fleet.node_pod), also
written to `--termination-log`; exit 0 measured, 1 failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

STOP_GRACE_S = 2.0


def bus_bandwidth_gbs(size_bytes: int, seconds: float, ranks: int) -> float:
    """all_reduce bus bandwidth in GB/s (1e9 bytes; nccl-tests' unit) of one operation (pure)."""
    if seconds <= 0 or ranks < 1:
        return 0.0
    return size_bytes / seconds / 1e9 * (2 * (ranks - 1) / ranks if ranks > 1 else 1.0)


def metric_name(backend: str, hip: bool) -> str:
    """The inspect metric a backend's figure is reported as (gpufleet.fleet.inspect.codes)."""
    if backend == "nccl":
        return "rccl_allreduce_busbw_gbs" if hip else "nccl_allreduce_busbw_gbs"
    return "gloo_allreduce_busbw_gbs"


def choose_backend(cuda_available: bool, device_count: int, ranks: int) -> str:
    """NCCL when the host has a GPU for every rank, gloo on the CPU otherwise (pure)."""
    return "nccl" if cuda_available and device_count >= ranks else "gloo"


def _worker(size_bytes: int, warmup: int, iters: int) -> int:
    import torch
    import torch.distributed as dist

    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = choose_backend(torch.cuda.is_available(), torch.cuda.device_count(), ranks)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=ranks)
    try:
        buf = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            if backend == "nccl":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            dist.all_reduce(buf)
            if backend == "nccl":
                torch.cuda.synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - t)
        if rank == 0:
            print(json.dumps({"seconds": times, "backend": backend,
                              "hip": bool(getattr(torch.version, "hip", None))}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(ranks: int, size_bytes: int, warmup: int, iters: int, deadline_s: float) -> dict[str, object]:
    """Run the ranks and return the JSON document (module docstring); RuntimeError when they fail."""
    port = _free_port()
    argv = [sys.executable, "-m", "gpufleet.fleet.inspect.collprobe", "--worker",
            "--size-bytes", str(size_bytes), "--warmup", str(warmup), "--iters", str(iters)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(ranks),
                                   "MASTER_PORT": str(port)})
             for r in range(ranks)]
    end = time.monotonic() + deadline_s
    outs: list[tuple[str, str]] = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(end - time.monotonic(), 0.1)))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {ranks} rank(s) did not finish within {deadline_s:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
            with contextlib.suppress(ValueError):  # communicate() already closed the pipes
                p.communicate()
    bad = [(r, p.returncode, outs[r][1]) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        r, rc, err = bad[0]
        raise RuntimeError(f"rank {r} exited {rc}: {' '.join(err.split()[-40:])}")
    report = json.loads(outs[0][0].strip().splitlines()[-1])
    backend, hip = str(report["backend"]), bool(report["hip"])
    times = [float(t) for t in report["seconds"]]
    busbw = max(bus_bandwidth_gbs(size_bytes, t, ranks) for t in times)
    return {"perf": {metric_name(backend, hip): round(busbw, 4)}, "backend": backend, "ranks": ranks,
            "sizeBytes": size_bytes, "iters": iters, "seconds": round(sum(times), 3)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.fleet.inspect.collprobe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="processes (one per GPU with CUDA)")
    p.add_argument("--size-mib", type=float, default=64.0, help="the all_reduce's buffer")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--deadline", type=float, default=120.0, help="seconds for the whole run")
    p.add_argument("--termination-log", type=Path, help="also write the JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size-bytes", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args.size_bytes, args.warmup, args.iters)
    problems = []
    if args.ranks < 1:
        problems.append(f"--ranks {args.ranks} must be at least 1")
    if not 0 < args.size_mib <= 65536:
        problems.append(f"--size-mib {args.size_mib} must be in (0, 65536]")
    if args.warmup < 0 or args.iters < 1:
        problems.append(f"--warmup {args.warmup} must be >= 0 and --iters {args.iters} >= 1")
    if args.deadline <= 0:
        problems.append(f"--deadline {args.deadline} must be positive")
    if problems:
        print(f"collprobe: {'; '.join(problems)}", file=sys.stderr)
        return 2
    size = max(4, int(args.size_mib * 1024 * 1024) // 4 * 4)
    try:
        doc: dict[str, object] = measure(args.ranks, size, args.warmup, args.iters, args.deadline)
        rc = 0
    except RuntimeError as e:
        doc, rc = {"perf": {}, "error": str(e)}, 1
    line = json.dumps(doc)
    print(line)
    if args.termination_log is not None:
        with contextlib.suppress(OSError):  # the figure is on stdout whatever happens here
            args.termination_log.write_text(line)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
