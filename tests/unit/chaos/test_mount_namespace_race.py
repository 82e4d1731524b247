"""A process may exit between listing a mount namespace's processes and entering it (a rank that
restarts): the storage fault enters through a member still alive, and never hides a real failure."""

from __future__ import annotations

import os

import pytest
from chaoslib.exceptions import ActivityFailed

from gpufleet.chaos import sysops
from gpufleet.chaos.backends import sandbox_undo

GONE = 4_194_304 + 17  # above the kernel's pid_max limit: never a live process


def test_a_member_that_exited_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def run(argv: list[str], check: bool = True) -> str:
        if argv[:3] == ["nsenter", "-t", str(GONE)]:
            raise ActivityFailed(f"nsenter: cannot open /proc/{GONE}/ns/mnt: No such file or directory")
        ran.append(argv)
        return ""

    monkeypatch.setattr(sysops, "run", run)
    assert sandbox_undo.run_in_mount_namespace([GONE, os.getpid()], ["true"])
    assert ran == [["nsenter", "-t", str(os.getpid()), "-m", "--", "true"]]
    assert not sandbox_undo.run_in_mount_namespace([GONE], ["true"])  # the namespace is gone too
    assert sandbox_undo.live_member([GONE, os.getpid()]) == os.getpid()


def test_a_failing_command_in_a_live_namespace_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], check: bool = True) -> str:
        raise ActivityFailed("mount: permission denied")

    monkeypatch.setattr(sysops, "run", run)
    with pytest.raises(ActivityFailed, match="permission denied"):
        sandbox_undo.run_in_mount_namespace([os.getpid()], ["mount", "x"])
