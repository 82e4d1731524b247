"""Write a bundle (one tar.gz: the collectors' outputs and manifest.json) and verify one.

The total size cap is on the uncompressed members, in collector order: what the table lists first
is what a reader asks for first, so a later member that does not fit is dropped (and recorded), never
an earlier one cut.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from gpufleet.fleet.bundle.model import MANIFEST_NAME, Caps, Manifest, Member
from gpufleet.fleet.bundle.runner import Collector, Output


class BundleError(Exception):
    """A bundle file cannot be read as one; the message names the file and what is wrong."""


def members(collectors: Sequence[Collector], outputs: Mapping[str, Output], caps: Caps
            ) -> tuple[list[Member], dict[str, bytes]]:
    """The manifest's records and the archive's files (name -> bytes), under the total cap."""
    records: list[Member] = []
    files: dict[str, bytes] = {}
    total = 0
    for c in collectors:
        out = outputs[c.name]
        common = dict(collector=c.name, command=list(c.command), exit_status=out.exit_status,
                      duration_s=round(out.duration_s, 3), truncated=out.truncated)
        if not out.data:
            records.append(Member(name=None, status=out.status, error=out.error or "no output", **common))
            continue
        if total + len(out.data) > caps.total_bytes:
            records.append(Member(
                name=None, status="dropped", size=0,
                error=f"{len(out.data)} bytes would pass the bundle's {caps.total_bytes}-byte cap "
                f"({total} already kept); was {out.status}" + (f": {out.error}" if out.error else ""),
                **common))
            continue
        total += len(out.data)
        files[c.member] = out.data
        records.append(Member(name=c.member, status=out.status, size=len(out.data),
                              sha256=hashlib.sha256(out.data).hexdigest(), error=out.error, **common))
    return records, files


def bundle_name(node: str, trigger: str, at: float) -> str:
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y%m%dT%H%M%S") + f"{int(at * 1000) % 1000:03d}Z"
    return f"bundle-{node}-{stamp}-{trigger}.tar.gz"


def write_bundle(out_dir: Path, manifest: Manifest, files: Mapping[str, bytes]) -> Path:
    """The archive under out_dir, written whole and renamed into place (a reader never sees half)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / bundle_name(manifest.node, manifest.trigger, manifest.started_at)
    tmp = path.with_name(f".{path.name}.tmp")
    mtime = int(manifest.finished_at)
    # gzip level 1, not tarfile's default 9: measured here on 16 MiB of slurmd-like log text, level 1
    # took 0.03 CPU s (to 114 KB) and level 9 0.09 CPU s (to 57 KB); an nvidia-bug-report.log.gz is
    # compressed already (0.49 CPU s per 16 MiB at any level). Time saved is time a drain waits less.
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        _add(tar, MANIFEST_NAME, manifest.model_dump_json(indent=2).encode(), mtime)
        for name, data in files.items():
            _add(tar, name, data, mtime)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    tar.addfile(info, io.BytesIO(data))


def read_manifest(path: Path) -> Manifest:
    """The bundle's manifest alone (for reports that link bundles)."""
    manifest, _ = _open(path, with_data=False)
    return manifest


def verify(path: Path) -> tuple[Manifest, list[str]]:
    """The manifest and every way the archive disagrees with it (size, sha256, missing or extra files)."""
    manifest, data = _open(path, with_data=True)
    problems: list[str] = []
    listed = {m.name for m in manifest.members if m.name is not None}
    for m in manifest.members:
        if m.name is None:
            continue
        got = data.get(m.name)
        if got is None:
            problems.append(f"{m.name}: listed in the manifest, absent from the archive")
            continue
        if len(got) != m.size:
            problems.append(f"{m.name}: {len(got)} bytes, the manifest says {m.size}")
        digest = hashlib.sha256(got).hexdigest()
        if digest != m.sha256:
            problems.append(f"{m.name}: sha256 {digest}, the manifest says {m.sha256}")
    for extra in sorted(set(data) - listed):
        problems.append(f"{extra}: in the archive, not in the manifest")
    if manifest.total_bytes > manifest.caps.total_bytes:
        problems.append(f"{manifest.total_bytes} bytes kept, over the cap of {manifest.caps.total_bytes}")
    return manifest, problems


def _open(path: Path, with_data: bool) -> tuple[Manifest, dict[str, bytes]]:
    if not path.is_file():
        raise BundleError(f"{path}: no such file")
    try:
        with tarfile.open(path, "r:gz") as tar:
            raw: bytes | None = None
            data: dict[str, bytes] = {}
            for info in tar:
                if not info.isfile():
                    raise BundleError(f"{path}: {info.name}: not a regular file (a bundle holds files only)")
                if info.name != MANIFEST_NAME and not with_data:
                    continue
                fh = tar.extractfile(info)
                assert fh is not None
                if info.name == MANIFEST_NAME:
                    raw = fh.read()
                else:
                    data[info.name] = fh.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{path}: not a gzip-compressed tar archive ({e})") from None
    if raw is None:
        raise BundleError(f"{path}: no {MANIFEST_NAME} in the archive")
    try:
        return Manifest.model_validate_json(raw), data
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise BundleError(f"{path}: {MANIFEST_NAME}: {where}: {first['msg']} "
                          f"({e.error_count()} problem(s))") from None


