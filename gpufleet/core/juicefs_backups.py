"""JuiceFS metadata backups in the storage sandbox's backup bucket: take one proven restorable, and
restore the newest proven one (the metadata backup job and the chaos backend's restore share these).

Taking a backup: `juicefs dump` of the live engine (the mounted file system's used inodes read just
before and after), the dump loaded into the scratch Redis (emptied first) and dumped again from
there, both counted, judged by core.juicefs.judge_dump; the dump is uploaded whatever the verdict,
with its evidence beside it (`<dump>.evidence.json`), so a failed backup is kept to be looked at and
never chosen by a restore.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.core import juicefs as jfs
from gpufleet.core.storage_contract import JuiceFsRecord, S3Credentials


def _read_counts(path: Path) -> jfs.DumpCounts | None:
    try:
        return jfs.count_dump(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def list_evidence(client: Any, bucket: str) -> list[jfs.DumpEvidence]:
    """Every dump's evidence in the backup bucket, oldest first (unreadable ones skipped)."""
    out: list[jfs.DumpEvidence] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=jfs.METADATA_PREFIX):
        for o in page.get("Contents", []):
            if not str(o["Key"]).endswith(jfs.EVIDENCE_SUFFIX):
                continue
            try:
                body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                out.append(jfs.DumpEvidence.model_validate_json(body))
            except (ClientError, ValueError):
                continue
    return sorted(out, key=lambda e: (e.taken_at, e.dump))


def take_backup(
    rec: JuiceFsRecord, client: Any, bucket: str, work: Path, previous: jfs.DumpEvidence | None
) -> jfs.DumpEvidence:
    """One metadata backup, proven (or not) and uploaded with its evidence."""
    work.mkdir(parents=True, exist_ok=True)
    taken_at, t0 = time.time(), time.monotonic()
    key = jfs.dump_key(taken_at)
    dump, again = work / "dump.json", work / "reloaded.json"
    mountpoint = Path(rec.mountpoint)
    before = jfs.used_inodes(mountpoint)
    jfs.run(jfs.dump_argv(rec.meta_url, dump))
    after = jfs.used_inodes(mountpoint)
    dumped = _read_counts(dump)
    reloaded, load_error = None, None
    scratch = jfs.redis_url(rec.scratch_port, rec.meta_db)
    try:
        jfs.run(jfs.redis_cli(rec.scratch_port, "FLUSHALL"), timeout_s=10)
        jfs.run(jfs.load_argv(scratch, dump))
        again.unlink(missing_ok=True)
        jfs.run(jfs.dump_argv(scratch, again))
        reloaded = _read_counts(again)
        if reloaded is None:
            load_error = "the scratch engine's dump is unreadable"
    except jfs.JuiceFsError as e:
        load_error = str(e)
    problems = jfs.judge_dump(
        dumped, reloaded, (before, after), previous.inodes if previous else None, load_error
    )
    client.upload_file(str(dump), bucket, key)
    evidence = jfs.evidence_of(key, taken_at, time.monotonic() - t0, dumped, reloaded, previous, problems,
                               live_inodes=(before, after))
    client.put_object(Bucket=bucket, Key=jfs.evidence_key(key), Body=evidence.model_dump_json().encode())
    return evidence


def restore_newest(
    rec: JuiceFsRecord, client: Any, bucket: str, creds: S3Credentials, work: Path
) -> jfs.DumpEvidence:
    """Load the newest verified dump of the backup bucket into the (empty) metadata engine and set
    the S3 keys again (a dump carries no secret). JuiceFsError when there is none or it fails."""
    chosen = jfs.newest_verified(list_evidence(client, bucket))
    if chosen is None:
        raise jfs.JuiceFsError(f"no verified metadata dump in {bucket}/{jfs.METADATA_PREFIX}")
    work.mkdir(parents=True, exist_ok=True)
    path = work / "restore.json"
    client.download_file(bucket, chosen.dump, str(path))
    jfs.run(jfs.load_argv(rec.meta_url, path))
    jfs.run(jfs.config_secret_argv(rec.meta_url, creds.access_key, creds.secret_key))
    return chosen


def _folders(client: Any, bucket: str, prefix: str) -> list[str]:
    """The names of the folders right under `prefix` (S3 common prefixes, '/' the delimiter)."""
    names: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        names += [str(p["Prefix"])[len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
    return names


def _last_numbered(client: Any, bucket: str, prefix: str) -> str | None:
    """The folder under `prefix` with the highest number: slice ids only grow with it."""
    numbered = [n for n in _folders(client, bucket, prefix) if n.isdigit()]
    return f"{prefix}{max(numbered, key=int)}/" if numbered else None


def highest_slice_id(client: Any, bucket: str, volume: str, hash_prefix: bool) -> int | None:
    """The highest slice id with a block in the volume's bucket, None when it holds none. Reads
    only the last folder of each level (`chunks/<id/10^6>/<id/10^3>/`), or with hashed folders the
    last `<id/10^6>` folder of each of the 256: a few listings, not the bucket's every object."""
    root = f"{volume}/{jfs.CHUNKS_DIR}"
    if hash_prefix:
        leaves = [_last_numbered(client, bucket, f"{root}{h}/") for h in _folders(client, bucket, root)]
    else:
        top = _last_numbered(client, bucket, root)
        leaves = [_last_numbered(client, bucket, top)] if top else []
    ids: list[int] = []
    for leaf in (x for x in leaves if x is not None):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=leaf):
            ids += [i for o in page.get("Contents", []) if (i := jfs.slice_id_of(str(o["Key"]))) is not None]
    return max(ids) if ids else None


def _redis_get(rec: JuiceFsRecord, key: str) -> str:
    # redis-cli writing to a pipe prints a value raw, and a missing key as an empty line.
    return jfs.run(jfs.redis_cli(rec.meta_port, "GET", key, db=rec.meta_db), timeout_s=10).strip()


def advance_slice_counter(rec: JuiceFsRecord, client: Any) -> dict[str, int | None]:
    """After a load and before any client mounts the restored engine: move its slice-id counter past
    every id the lost engine gave out (core.juicefs says why). JuiceFsError when the engine holds no
    volume setting or counter (not a loaded JuiceFS engine)."""
    try:
        hash_prefix = jfs.hash_prefixed(json.loads(_redis_get(rec, jfs.VOLUME_SETTING_KEY)))
    except ValueError as e:
        raise jfs.JuiceFsError(f"the restored engine's volume setting is unreadable: {e}") from None
    loaded = _redis_get(rec, jfs.NEXT_SLICE_COUNTER)
    if not loaded.isdigit():
        raise jfs.JuiceFsError(f"the restored engine has no {jfs.NEXT_SLICE_COUNTER} counter: {loaded!r}")
    counter = int(loaded)
    highest = highest_slice_id(client, rec.bucket, rec.name, hash_prefix)
    floor = jfs.slice_counter_floor(highest)
    if counter < floor:
        jfs.run(jfs.redis_cli(rec.meta_port, "SET", jfs.NEXT_SLICE_COUNTER, str(floor), db=rec.meta_db),
                timeout_s=10)
    return {"loaded": counter, "highest_in_bucket": highest, "set_to": max(counter, floor)}
