"""`python -m gpufleet.sandbox.training.smoke`: a one-step training smoke run on one sandbox node,
outside Slurm: the last part of an upgrade's return gate (issue 16; docs/fleet-upgrade.md "The gate").

Why outside Slurm: a node under upgrade is drained with the rollout's mark, and Slurm starts no job
on a drained node; resuming it into a maintenance reservation for the smoke job would clear the mark
that remediation reads. So the smoke runs where an operator's burn-in test runs on a drained node:
on the node itself (here, in its network namespace), as the job's own ranks run there: the same
training program (train.py), the same GPU rules (a rank fails on a fatal GPU fault and blocks on a
hung GPU), gloo over the node's fabric interface, with the task environment that
`srun -N1 -n<ranks> -w <node>` gives (srun(1), "OUTPUT ENVIRONMENT VARIABLES").

It passes when every rank exits 0 within the deadline, rank 0 logged step 1 with a finite loss, and
the checkpoint written at step 1 verifies against its manifest (sha256 of shard and metadata). Its
checkpoints, events and logs live in a scratch folder removed afterwards (kept on a failure, named in
the detail); its rendezvous port is outside the job's range and it serves no metrics.

Prints one JSON object {"passed", "detail", "seconds"}; exit 0 passed, 1 failed, 2 bad input.

`--standalone` runs it where no sandbox is around it: in a pod (the Kubernetes gate's smoke pod on a
kubelet node, gpufleet.fleet.node_pod). It then makes its own scratch folder with the
node's folder and a hosts file that puts the node on loopback, so the ranks meet over the loopback
of whatever network namespace it runs in, and with `--termination-log /dev/termination-log` it also
writes its JSON where the kubelet takes the container's termination message from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.training_events import TrainingEvent, read_events
from gpufleet.sandbox.training.checkpoint import CheckpointDir

STEPS = 1
# The job's rendezvous ports are 29500 + incarnation % 100 (train.rendezvous_port): the smoke's is
# past them, so it never meets a socket of the job's.
RENDEZVOUS_PORT = 29650
JOB_ID = 0  # no Slurm job: the checkpoint key and the events say job 0
STOP_GRACE_S = 2.0  # SIGTERM (the rank unregisters from its GPUs), then SIGKILL
LOG_TAIL_LINES = 20  # of each rank's log, on stderr, when a standalone run fails


@dataclass(frozen=True)
class SmokeVerdict:
    passed: bool
    detail: str


def task_env(node: str, rank: int, ranks: int, gpus: int) -> dict[str, str]:
    """The environment srun gives task `rank` of a one-node step of `ranks` tasks holding every
    GPU of the node (the training job's --gres=gpu:<gpus>)."""
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ranks),
        "SLURM_NODEID": "0",
        "SLURM_LOCALID": str(rank),
        "SLURMD_NODENAME": node,
        "SLURM_JOB_NODELIST": node,
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_JOB_GPUS": ",".join(str(g) for g in range(gpus)),
        "GPUFLEET_INCARNATION": "0",
    }


def standalone_base(scratch: Path, node: str) -> tuple[Path, Path]:
    """A base folder with the node's folder, and a hosts file that puts the node on loopback (its
    management and fabric address 127.0.0.1 on `lo`), in `scratch`."""
    base = scratch / "base"
    (base / "nodes" / node).mkdir(parents=True)
    hosts = scratch / "hosts.json"
    hosts.write_text(json.dumps({node: {"mgmt_ip": "127.0.0.1", "fabric_ip": "127.0.0.1",
                                        "fabric_ifname": "lo"}}))
    return base, hosts


def judge_smoke(exits: Sequence[int | None], events: Sequence[TrainingEvent],
                checkpoint: tuple[int | None, str], deadline_s: float) -> SmokeVerdict:
    """Pure: the verdict from each rank's exit code (None: still running at the deadline), the
    events the ranks logged, and the newest valid checkpoint's step with what was skipped."""
    problems = []
    errors = {e.rank: e.message for e in events if e.event == "error" and e.message}
    for rank, rc in enumerate(exits):
        if rc is None:
            problems.append(f"rank {rank} did not finish within {deadline_s:g} s (a hung GPU never "
                            "completes a step)")
        elif rc != 0:
            problems.append(f"rank {rank} exited {rc}" + (f": {errors[rank]}" if rank in errors else ""))
    if problems:  # the missing step and checkpoint follow from a rank that failed or hung
        return SmokeVerdict(False, "smoke run failed: " + "; ".join(problems))
    steps = [e for e in events if e.event == "step" and e.rank == 0 and e.step == STEPS]
    loss = steps[-1].loss if steps else None
    if not steps:
        problems.append(f"rank 0 logged no step {STEPS}")
    elif loss is None or not math.isfinite(loss):
        problems.append(f"step {STEPS}'s loss is {loss} (not a finite number)")
    step, skipped = checkpoint
    if step != STEPS:
        problems.append(f"no valid checkpoint of step {STEPS}" + (f" ({skipped})" if skipped else ""))
    if problems:
        return SmokeVerdict(False, "smoke run failed: " + "; ".join(problems))
    return SmokeVerdict(True, f"smoke run ok: {len(exits)} rank(s), step {STEPS} loss {loss:.4g}, "
                              "checkpoint verified")


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_smoke(node: str, ranks: int, gpus: int, base_dir: Path, hosts_file: Path, deadline_s: float,
              rendezvous_port: int = RENDEZVOUS_PORT, python: str = sys.executable) -> SmokeVerdict:
    """Run the ranks on this node (the caller is in its namespace) and judge them."""
    scratch = Path(tempfile.mkdtemp(prefix=f"smoke-{node}-", dir=base_dir / "nodes" / node))
    ckpt, events = scratch / "checkpoints", scratch / "events.jsonl"
    argv = [python, "-m", "gpufleet.sandbox.training.train", "--base-dir", str(base_dir),
            "--checkpoint-dir", str(ckpt), "--events-file", str(events), "--file-sd-dir", str(scratch),
            "--hosts-file", str(hosts_file), "--max-steps", str(STEPS), "--checkpoint-every", str(STEPS),
            "--step-sleep", "0", "--rendezvous-port", str(rendezvous_port), "--metrics-port", "0",
            "--job-name", f"gpufleet-smoke-{node}"]
    procs = []
    try:
        for rank in range(ranks):
            with open(scratch / f"rank-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(argv, env={**os.environ, **task_env(node, rank, ranks, gpus)},
                                              stdout=log, stderr=subprocess.STDOUT, cwd=scratch))
        end = time.monotonic() + deadline_s
        for p in procs:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        exits = [p.poll() for p in procs]
    finally:
        _stop(procs)
    loaded, skipped = CheckpointDir(ckpt).newest_valid() if ckpt.is_dir() else (None, [])
    verdict = judge_smoke(exits, read_events(events),
                          (None if loaded is None else loaded.key.step,
                           "; ".join(f"{k.stem}: {why}" for k, why in skipped)), deadline_s)
    if verdict.passed:
        shutil.rmtree(scratch, ignore_errors=True)
        return verdict
    return SmokeVerdict(False, f"{verdict.detail} (logs in {scratch})")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.training.smoke", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True)
    p.add_argument("--ranks", type=int, default=1, help="ranks on the node (the job's ranks per node)")
    p.add_argument("--gpus", type=int, required=True, help="the node's GPUs (every rank holds all)")
    p.add_argument("--base-dir", type=Path, help="the sandbox's run folder")
    p.add_argument("--hosts-file", type=Path)
    p.add_argument("--standalone", action="store_true",
                   help="no sandbox around it (a pod): its own scratch folder and a loopback hosts file")
    p.add_argument("--termination-log", type=Path, help="also write the JSON verdict here")
    p.add_argument("--deadline", type=float, default=20.0, help="seconds for the ranks to finish")
    p.add_argument("--rendezvous-port", type=int, default=RENDEZVOUS_PORT)
    args = p.parse_args(argv)
    problems = []
    if args.ranks < 1 or args.gpus < 1:
        problems.append(f"--ranks {args.ranks} and --gpus {args.gpus} must be at least 1")
    if args.standalone:
        if args.base_dir or args.hosts_file:
            problems.append("--standalone makes its own --base-dir and --hosts-file: give neither")
    else:
        if args.base_dir is None:
            problems.append("--base-dir is required (or --standalone)")
        elif not (args.base_dir / "nodes" / args.node).is_dir():
            problems.append(f"{args.base_dir / 'nodes' / args.node}: no such node folder")
        if args.hosts_file is None:
            problems.append("--hosts-file is required (or --standalone)")
        elif not args.hosts_file.is_file():
            problems.append(f"{args.hosts_file}: no hosts file")
    if args.deadline <= 0:
        problems.append(f"--deadline {args.deadline} must be positive")
    if problems:
        print(f"smoke: {'; '.join(problems)}", file=sys.stderr)
        return 2
    t = time.monotonic()
    if args.standalone:
        with tempfile.TemporaryDirectory(prefix="gpufleet-smoke-") as tmp:
            base, hosts = standalone_base(Path(tmp), args.node)
            verdict = run_smoke(args.node, args.ranks, args.gpus, base, hosts, args.deadline,
                                args.rendezvous_port)
            if not verdict.passed:  # the scratch folder goes with the pod: its ranks' logs go to stderr
                for log in sorted(Path(tmp).rglob("rank-*.log")):
                    tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                    print(f"--- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)
                detail = verdict.detail.split(" (logs in ", 1)[0]
                verdict = SmokeVerdict(False, f"{detail} (rank logs on stderr)")
    else:
        verdict = run_smoke(args.node, args.ranks, args.gpus, args.base_dir, args.hosts_file, args.deadline,
                            args.rendezvous_port)
    line = json.dumps({"passed": verdict.passed, "detail": verdict.detail,
                       "seconds": round(time.monotonic() - t, 2)})
    print(line)
    if args.termination_log is not None:
        with contextlib.suppress(OSError):  # the verdict is on stdout whatever happens here
            args.termination_log.write_text(line)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
