"""PID + start-time bookkeeping and safe stopping (gpufleet.sandbox.processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.sandbox import processes


def test_start_time_identifies_a_process_and_survives_exec(tmp_path: Path) -> None:
    started = processes.spawn("sleeper", ["sleep", "30"], tmp_path / "log")
    try:
        rec = started.record
        assert rec.start_time == processes.start_time(rec.pid)
        assert processes.alive(rec)
        # The same PID with another start time is a different process: never signalled.
        impostor = SandboxProcess(name="x", pid=rec.pid, start_time=rec.start_time + 1, launch=rec.launch)
        assert not processes.alive(impostor)
        assert not processes.signal_verified(impostor, 15)
        assert processes.alive(rec)
        assert processes.stop([rec], grace_s=2) == []
        started.popen.wait(timeout=5)
        assert not processes.alive(rec)
    finally:
        if started.popen.poll() is None:
            started.popen.kill()
            started.popen.wait()


def test_stop_escalates_to_sigkill_for_a_process_ignoring_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            st = processes.start_time(p.pid)
            assert st is not None
            assert processes.stop_pids({p.pid: st}, grace_s=0.3) == []
            assert p.wait(timeout=5) == -9
        finally:
            if p.poll() is None:
                p.kill()


def test_spawn_reports_an_immediate_failure(tmp_path: Path) -> None:
    try:
        processes.spawn("nothing", ["/nonexistent/binary"], tmp_path / "log")
    except (RuntimeError, FileNotFoundError):
        pass
    else:
        raise AssertionError("spawning a missing binary did not fail")


def test_launch_argv_wraps_and_keeps_the_pid() -> None:
    argv = Launch(program=["slurmd", "-D"], netns="ns1", hostname="gpu-0", log="/l").argv()
    assert argv[:4] == ["ip", "netns", "exec", "ns1"]
    assert argv[4:7] == ["unshare", "--uts", "--"]
    assert argv[-3:] == ["gpu-0", "slurmd", "-D"]
    assert "exec" in argv[9]  # the shell exec()s: the PID stays the daemon's
    assert Launch(program=["x"], log="/l").argv() == ["x"]


def test_pids_mentioning_finds_only_the_named_programs(tmp_path: Path) -> None:
    marker = str(tmp_path / "run-feed01")
    code = "import sys, time; print('ready', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE)
    try:
        # Popen returns after fork; /proc shows the new cmdline only once exec() is done.
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        found = processes.pids_mentioning(marker, frozenset({"python"}))
        assert p.pid in found
        assert p.pid not in processes.pids_mentioning(marker, frozenset({"munged"}))
    finally:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def test_spawn_records_how_to_start_the_daemon_again(tmp_path: Path) -> None:
    """The launch recipe (program, namespaces, env, log) lands in the record: a chaos node-crash
    rollback restarts the daemon from it instead of re-reading /proc."""
    started = processes.spawn("sleeper@n1", ["sleep", "30"], tmp_path / "log", env={"A": "1"}, node="n1")
    try:
        rec = started.record
        assert rec.launch.program == ["sleep", "30"]
        assert rec.launch.argv() == ["sleep", "30"]
        assert rec.launch.env == {"A": "1"}
        assert rec.launch.log == str(tmp_path / "log")
        assert rec.node == "n1"
        environ = Path(f"/proc/{rec.pid}/environ").read_bytes().split(b"\0")
        assert [e for e in environ if e] == [b"A=1"]  # what is recorded is what it got
        assert Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"30"]
    finally:
        started.popen.kill()
        started.popen.wait()
