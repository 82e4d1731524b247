"""The storage sandbox's checkpoint writer: a stand-in for a training job's checkpointing.

It counts steps (one every `--step-seconds`), saves a checkpoint every `--interval` seconds where
the stack says (the checkpoint bucket through boto3, core.s3_checkpoints, or a folder of the JuiceFS
mount, core.fs_checkpoints: shards of seeded random bytes, metadata, manifest last), keeps the
newest `--keep` complete ones, and when a save fails (bucket gone, radosgw down, OSDs full, the
mount broken) it stops counting, as a job whose store is gone does, and resumes from the
newest checkpoint that verifies once the store answers again. Every save, failure and resume is a
line of its events file (JSON), which drills read. It is not PyTorch. When the stack's Slurm sandbox
runs its PyTorch training job on the same store (on the volume, ADR 0068, or in the bucket, ADR
0070), the drills judge that job and report the writer beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from gpufleet.core.checkpoint_manifest import stem
from gpufleet.core.fs_checkpoints import checkpoint_store_of
from gpufleet.core.jsonl import read_objects
from gpufleet.core.storage_contract import StorageSandboxState

JOB = 1  # the writer is one job; its generation is (JOB, restart)
EMPTY_GRACE_S = 60.0  # after the store came back empty, how long to wait for a restore


class Events:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "event": event, **fields}, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    return read_objects(path)


def _shards(step: int, count: int, size: int) -> dict[str, bytes]:
    rng = random.Random(step)
    return {f"shard-{i:02d}.bin": rng.randbytes(size) for i in range(count)}


def run(args: argparse.Namespace) -> None:
    state = StorageSandboxState.model_validate_json(Path(args.state_file).read_text())
    store = checkpoint_store_of(state)  # the JuiceFS mount or the checkpoint bucket, as the stack says
    events = Events(Path(args.events))
    stop = False

    def _term(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    step = 0
    restart = -1  # the first resume makes it 0 (or one more than the store's newest)
    saved_any = False
    empty_until = 0.0
    interrupted = True  # at start: resume from what the store holds
    last_step_at = time.monotonic()
    next_save = time.monotonic() + args.interval
    while not stop:
        now = time.monotonic()
        if interrupted:
            try:
                choice = store.newest_verified()
            except Exception as e:  # the store still does not answer: try again shortly
                events.emit("resume_failed", error=f"{type(e).__name__}: {e}"[:300])
                empty_until = time.monotonic() + EMPTY_GRACE_S
                time.sleep(min(args.interval, 1.0))
                continue
            if choice.chosen is None and saved_any and time.monotonic() < empty_until:
                # The store answers but holds no checkpoint although this job saved some: a restore
                # may be under way (its bucket is recreated before its checkpoints are copied back).
                # Starting from step 0 now would throw the restore away; wait a while for it first.
                time.sleep(min(args.interval, 1.0))
                continue
            step = choice.chosen.key[2] if choice.chosen else 0
            # Each resume is a new generation (as a requeued job's restart count): its checkpoints
            # never reuse the name of one saved before the failure that a backup may still hold.
            restart = max(restart + 1, choice.chosen.key[1] + 1 if choice.chosen else 0)
            events.emit(
                "resume",
                step=step,
                restart=restart,
                checkpoint=stem(choice.chosen.key) if choice.chosen else None,
                skipped=[f"{stem(k)}: {why}" for k, why in choice.skipped],
            )
            interrupted = False
            last_step_at = time.monotonic()
            next_save = last_step_at + args.interval
            continue
        while now - last_step_at >= args.step_seconds:
            step += 1
            last_step_at += args.step_seconds
        if now >= next_save:
            t0 = time.monotonic()
            try:
                m = store.put(
                    (JOB, restart, step),
                    _shards(step, args.shards, args.shard_bytes),
                    json.dumps({"step": step}).encode(),
                    time.time(),
                )
                events.emit(
                    "checkpoint",
                    step=step,
                    bytes=m.total_bytes(),
                    seconds=round(time.monotonic() - t0, 4),
                    written_at=m.written_at,
                )
                saved_any = True
                complete = store.complete()
                for old in complete[: max(len(complete) - args.keep, 0)]:
                    store.delete((old.job, old.restart, old.step))
            except Exception as e:  # the store failed: this job stops until it can resume
                events.emit("checkpoint_failed", step=step, error=f"{type(e).__name__}: {e}"[:300])
                interrupted = True
                empty_until = time.monotonic() + EMPTY_GRACE_S
            next_save = time.monotonic() + args.interval
        time.sleep(min(args.step_seconds, 0.05))
    events.emit("stopped", step=step)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="gpufleet-checkpoint-writer", description=__doc__)
    p.add_argument("--state-file", required=True, help="the storage sandbox's state file")
    p.add_argument("--events", required=True)
    p.add_argument("--interval", type=float, required=True, help="seconds between checkpoints")
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--shard-bytes", type=int, default=1 << 20)
    p.add_argument("--keep", type=int, default=20, help="complete checkpoints kept (a minute at 3 s)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
