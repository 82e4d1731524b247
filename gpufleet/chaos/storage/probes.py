"""Checkpoint store probes."""

from __future__ import annotations

import os
import uuid

from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine

__all__ = ["checkpoint_store_writable"]


def checkpoint_store_writable(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """True when a file can be created, fsync'd and removed in the sandbox's checkpoint directory."""
    ctx = engine.context(configuration)
    if ctx.backend_name != "sandbox":
        raise ActivityFailed("checkpoint_store_writable checks the sandbox's checkpoint directory")
    from gpufleet.chaos.backends.sandbox import SandboxBackend

    b = ctx.backend()
    assert isinstance(b, SandboxBackend)
    path = b.state.checkpoint_dir
    if not path:
        raise ActivityFailed("the sandbox state names no checkpoint_dir")
    probe = os.path.join(path, f".gpufleet-probe-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)
    return True
