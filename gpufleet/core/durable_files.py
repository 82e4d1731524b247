"""Files that survive a crash whole or not at all: what both checkpoint writers (the training job's
directory, gpufleet.sandbox.training.checkpoint, and the file-system store on a JuiceFS mount,
gpufleet.core.fs_checkpoints) rely on to write a manifest last."""

from __future__ import annotations

import os
import time
from pathlib import Path


def fsync_dir(d: Path) -> None:
    """Make the directory's entries (files created, linked, renamed in it) durable."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_no_replace(final: Path, data: bytes) -> None:
    """Write to a private temp file, fsync, then link(2) it into place: fails with FileExistsError
    instead of replacing an existing file (rename(2) would replace it)."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def replace_durably(final: Path, data: bytes) -> None:
    """Write to a private temp file, fsync, then rename(2) it over `final`."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def write_private(path: Path, text: str) -> None:
    """A file only its owner may read (mode 0600 from its creation, never widened in between): keys,
    tokens. The folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
