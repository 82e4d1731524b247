"""What the end-to-end tests share: running the gpufleet CLI against a private state root, a
Kubernetes sandbox for a test module, waiting, bounded, for a condition, and the nvidia-smi test
double that plays a kwok node's GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from gpufleet.core.sandbox_contract import KubeSandboxState, kube_state_path, read_kube_state
from gpufleet.sandbox.kube import require_kube_paths

REPO = Path(__file__).resolve().parents[2]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
T = TypeVar("T")


def gpufleet(root: Path, *args: str, timeout: float = 300, env_extra: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), **(env_extra or {})}
    return subprocess.run(
        [GPUFLEET, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


@contextmanager
def kube_sandbox(tmp_path_factory: pytest.TempPathFactory, root_name: str, stack: str, *up_args: str
                 ) -> Iterator[tuple[Path, KubeSandboxState, subprocess.CompletedProcess[str]]]:
    """`sandbox up --kubernetes` for one test module, brought down whatever happens; yields the state
    root, the sandbox's state and what `up` printed. The Kubernetes binaries must be built: `make
    test` builds them first, so their absence fails the test instead of skipping it."""
    try:
        require_kube_paths()
    except RuntimeError as e:
        pytest.fail(str(e))
    root = tmp_path_factory.mktemp(root_name)
    res = gpufleet(root, "sandbox", "up", "--kubernetes", "--stack", stack, *up_args)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield root, read_kube_state(stack, root), res
    finally:
        if kube_state_path(stack, root).exists():
            down = gpufleet(root, "sandbox", "down", "--kubernetes", "--stack", stack)
            assert down.returncode == 0, down.stdout + down.stderr


# 8 healthy H100s; GPU $SMI_BAD_GPU (if set) with 2 uncorrectable volatile ECC errors; the driver
# version NVML reports read from the file $SMI_DRIVER_FILE (if set), else 550.90.07.
NVIDIA_SMI_DOUBLE = """#!/bin/sh
v=550.90.07
[ -n "${SMI_DRIVER_FILE:-}" ] && v=$(cat "$SMI_DRIVER_FILE")
case "$1" in
  --query-gpu=*) for i in 0 1 2 3 4 5 6 7; do u=0; [ "$i" = "${SMI_BAD_GPU:-}" ] && u=2
      printf '%s, 00000000:%02X:00.0, %s, 0, 35, 5, 16, %s, 96.00.89.00.01\\n' "$i" $((i + 16)) "$u" "$v"
    done ;;
  --query-remapped-rows=*) for i in 0 1 2 3 4 5 6 7; do
      printf '00000000:%02X:00.0, 0, 0, 0, 0\\n' $((i + 16))
    done ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def nvidia_smi_double(bin_dir: Path) -> str:
    """Write the double as `bin_dir/nvidia-smi`; returns a PATH with `bin_dir` first."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI_DOUBLE)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


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
