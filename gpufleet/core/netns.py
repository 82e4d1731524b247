"""Entering a network namespace from one thread (setns(2) is per-thread on Linux).

Python 3.11 has no os.setns, so this calls libc's. A socket belongs to the namespace of the thread
that created it, so a thread that entered a namespace can create sockets there and hand them to
the rest of the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000  # include/uapi/linux/sched.h
NETNS_RUN_DIR = Path("/run/netns")  # where `ip netns add` bind-mounts named namespaces

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def netns_path(name: str) -> Path:
    return NETNS_RUN_DIR / name


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the CALLING THREAD into the namespace open at fd."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def enter(name_or_path: str | Path) -> None:
    path = Path(name_or_path)
    if not path.is_absolute():
        path = netns_path(str(name_or_path))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd)
    finally:
        os.close(fd)


def executor_in(name_or_path: str | Path) -> ThreadPoolExecutor:
    """A one-thread executor whose thread lives in the namespace; shut it down when done."""
    return ThreadPoolExecutor(max_workers=1, initializer=enter, initargs=(name_or_path,))


def run_in(name_or_path: str | Path, fn: Callable[[], T]) -> T:
    """Run fn in a fresh thread inside the namespace and return its result."""
    with executor_in(name_or_path) as ex:
        return ex.submit(fn).result()


def current_netns_inode() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino
