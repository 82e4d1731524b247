"""The storage sandbox's backup job: every checkpoint copied to the versioned backup bucket, proven.

Every `--interval` seconds: each complete checkpoint of the checkpoint bucket that the backup
bucket does not hold yet is copied (core.s3_checkpoints: the source verified against its manifest
while read, the copy read back and verified, the manifest written last), and the evidence of that
verified copy (when, how long, bytes, result) is written beside it as `evidence/<stem>.json`: a
backup whose copy was never read back and checked is not counted as a backup. What the real
cluster runs instead is declared by the Pulumi program (docs/storage.md says what is left out).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

from gpufleet.core.checkpoint_manifest import stem
from gpufleet.core.fs_checkpoints import FsCheckpointStore, checkpoint_store_of
from gpufleet.core.s3_checkpoints import S3CheckpointStore, store_for
from gpufleet.core.s3_job_checkpoints import copy_fence, job_prefixes
from gpufleet.core.storage_contract import BACKUP_PREFIX, EVIDENCE_PREFIX, StorageSandboxState
from gpufleet.sandbox.storage.writer import Events


def backup_once(state: StorageSandboxState, events: Events, keep: int = 20) -> int:
    """Copy what is not backed up yet: the checkpoint writer's checkpoints and, when training jobs
    checkpoint straight to the bucket (ADR 0070), each job's prefix (its fence markers first) to
    the same prefix under the backup's; the number of checkpoints copied and verified. Only the
    newest `keep` backups of each stay current (older ones are deleted, and stay restorable as
    noncurrent versions in the versioned bucket)."""
    assert state.backup_bucket is not None
    src = checkpoint_store_of(state)
    pairs = [(src, store_for(state, state.backup_bucket, BACKUP_PREFIX), "")]
    if isinstance(src, S3CheckpointStore):
        for prefix in job_prefixes(src.client, src.bucket):
            job = S3CheckpointStore(src.client, src.bucket, prefix)
            dst = store_for(state, state.backup_bucket, BACKUP_PREFIX + prefix)
            copy_fence(job, dst)
            pairs.append((job, dst, prefix))
    return sum(_backup_store(s, d, evidence_under, events, keep) for s, d, evidence_under in pairs)


def _backup_store(src: FsCheckpointStore | S3CheckpointStore, dst: S3CheckpointStore, evidence_under: str,
                  events: Events, keep: int) -> int:
    have = {(m.job, m.restart, m.step) for m in dst.complete()}
    copied = 0
    for m in src.complete():
        key = (m.job, m.restart, m.step)
        if key in have:
            continue
        t0, started = time.monotonic(), time.time()
        problems = src.copy_to(m, dst)
        seconds = round(time.monotonic() - t0, 4)
        evidence = {
            "checkpoint": stem(key),
            "step": m.step,
            "written_at": m.written_at,
            "started_at": started,
            "seconds": seconds,
            "bytes": m.total_bytes(),
            "verified": not problems,
            "problems": problems,
            **({"job_prefix": evidence_under} if evidence_under else {}),
        }
        if not problems:
            dst.client.put_object(
                Bucket=dst.bucket,
                Key=f"{EVIDENCE_PREFIX}{evidence_under}{stem(key)}.json",
                Body=json.dumps(evidence, sort_keys=True).encode(),
            )
            copied += 1
        events.emit("backup" if not problems else "backup_failed", **evidence)
    complete = dst.complete()
    for old in complete[: max(len(complete) - keep, 0)]:
        dst.delete((old.job, old.restart, old.step))
    return copied


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="gpufleet-backup", description=__doc__)
    p.add_argument("--state-file", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--interval", type=float, required=True)
    args = p.parse_args(argv)
    state = StorageSandboxState.model_validate_json(Path(args.state_file).read_text())
    events = Events(Path(args.events))
    stop = False

    def _term(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    while not stop:
        t0 = time.monotonic()
        try:
            backup_once(state, events)
        except Exception as e:  # the store is down: the next round tries again
            events.emit("backup_failed", error=f"{type(e).__name__}: {e}"[:300])
        time.sleep(max(args.interval - (time.monotonic() - t0), 0.1))


if __name__ == "__main__":
    main()
