"""The node-hang rollback that models the remediation (reboot): frozen processes are killed, never
thawed, and the node's daemons are started again."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from gpufleet.chaos.backends import sandbox_undo
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.core import procs


def test_reboot_hung_kills_the_frozen_processes_then_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    p = subprocess.Popen(["sleep", "60"])
    try:
        st = procs.start_time(p.pid)
        assert st is not None
        p.send_signal(signal.SIGSTOP)
        restarted: list[dict[str, object]] = []
        monkeypatch.setattr(sandbox_undo, "rb_restart_daemons", lambda a: restarted.append(a))
        t0 = time.monotonic()
        ROLLBACKS["sandbox.reboot-hung"]({"pids": [[p.pid, st]], "restart": {"node": "gpu-0"}})
        assert p.wait(timeout=5) == -signal.SIGKILL  # killed while stopped, not thawed
        assert restarted == [{"node": "gpu-0"}]
        assert time.monotonic() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_reboot_hung_never_signals_a_reused_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    p = subprocess.Popen(["sleep", "60"])
    try:
        st = procs.start_time(p.pid)
        assert st is not None
        monkeypatch.setattr(sandbox_undo, "rb_restart_daemons", lambda a: None)
        sandbox_undo.rb_reboot_hung({"pids": [[p.pid, st + 1]], "restart": {}})  # another process
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
