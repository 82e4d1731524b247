"""The storage sandbox's JuiceFS metadata backup job: every `--interval` seconds a `juicefs dump` to
the backup bucket, each one proven restorable in the scratch Redis before it counts
(core.juicefs_backups.take_backup); the evidence (when, how long, counts, result) is stored beside
the dump and is a line of this job's events file. A dump that fails to load, disagrees with the live
file system or shrinks sharply against the previous verified one is a failed backup: kept with its
evidence, never restored from.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from gpufleet.core import juicefs as jfs
from gpufleet.core.juicefs_backups import list_evidence, take_backup
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.storage.writer import Events

KEEP = 20  # current dumps kept (older ones stay as noncurrent versions of the versioned bucket)


def prune(client: object, bucket: str, evidence: list[jfs.DumpEvidence], keep: int = KEEP) -> None:
    """Delete all but the newest `keep` dumps (and their evidence), never the newest verified one."""
    newest = jfs.newest_verified(evidence)
    for e in evidence[: max(len(evidence) - keep, 0)]:
        if newest is not None and e.dump == newest.dump:
            continue
        for key in (e.dump, jfs.evidence_key(e.dump)):
            client.delete_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="gpufleet-metadata-backup", description=__doc__)
    p.add_argument("--state-file", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--interval", type=float, required=True)
    args = p.parse_args(argv)
    state = StorageSandboxState.model_validate_json(Path(args.state_file).read_text())
    rec, bucket = state.juicefs, state.backup_bucket
    if rec is None or bucket is None:
        raise SystemExit("this storage sandbox has no JuiceFS or no backup bucket")
    client = store_for(state, bucket).client
    events = Events(Path(args.events))
    work = Path(state.base_dir) / "juicefs" / "backup-work"
    stop = False

    def _term(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    previous: jfs.DumpEvidence | None = None
    while not stop:
        t0 = time.monotonic()
        try:
            if previous is None:
                previous = jfs.newest_verified(list_evidence(client, bucket))
            evidence = take_backup(rec, client, bucket, work, previous)
            if evidence.verified:
                previous = evidence
            events.emit(
                "metadata_backup" if evidence.verified else "metadata_backup_failed", **evidence.model_dump()
            )
            prune(client, bucket, list_evidence(client, bucket))
        except Exception as e:  # the engine, the mount or the store is down: the next round tries again
            events.emit("metadata_backup_failed", error=f"{type(e).__name__}: {e}"[:400])
        time.sleep(max(args.interval - (time.monotonic() - t0), 0.1))


if __name__ == "__main__":
    main()
