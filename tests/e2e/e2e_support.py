"""What the end-to-end tests share: running the gpufleet CLI against a private state root, and
waiting, bounded, for a condition."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
T = TypeVar("T")


def gpufleet(root: Path, *args: str, timeout: float = 300, env_extra: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), **(env_extra or {})}
    return subprocess.run(
        [GPUFLEET, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def wait_until(what: str, check: Callable[[], T | None], timeout_s: float, interval_s: float = 0.5) -> T:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:
            last = e
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}" + (f" (last error: {last})" if last else "")
    )


@contextmanager
def sandbox_up(root: Path, stack: str, *args: str, down_timeout: float = 300) -> Iterator[None]:
    """`gpufleet sandbox up --stack <stack> <args>` under `root`, asserted; `sandbox down` on the way
    out whatever happened (300 s: a down took over 120 s at load ~250)."""
    res = gpufleet(root, "sandbox", "up", "--stack", stack, *args)
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        yield
    finally:
        gpufleet(root, "sandbox", "down", "--stack", stack, timeout=down_timeout)
