"""Collectors run bounded: exit status, missing tools, timeouts (the whole process group killed),
output caps (truncation), the bundle's deadline, and one collector's failure never hiding another."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpufleet.fleet.bundle.runner import Collector, ReadError, read_tail, run_all, run_command, run_one

PY = sys.executable


def test_a_command_that_succeeds_is_ok_with_its_output_and_exit_status() -> None:
    out = run_command([PY, "-c", "print('hello')"], 10, 1000)
    assert (out.data, out.status, out.exit_status) == (b"hello\n", "ok", 0)
    assert (out.truncated, out.error) == (False, None)


def test_a_command_that_fails_keeps_its_output_and_exit_status() -> None:
    out = run_command([PY, "-c", "import sys; print('bad'); sys.exit(3)"], 10, 1000)
    assert (out.data, out.status, out.exit_status) == (b"bad\n", "failed", 3)
    assert out.error == "exit status 3"


def test_a_missing_tool_is_a_failure_that_names_it() -> None:
    out = run_command(["no-such-tool-gpufleet", "-q"], 10, 1000)
    assert out.status == "failed" and out.exit_status is None
    assert out.error is not None and out.error.startswith("no-such-tool-gpufleet:")


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The shell starts a child that would outlive a kill of the shell alone.
    script = f"sleep 30 & echo $! > {pidfile}; echo started; wait"
    t0 = time.monotonic()
    out = run_command(["sh", "-c", script], 1.0, 1000)
    assert time.monotonic() - t0 < 5
    assert out.status == "timeout" and out.exit_status is None and out.data == b"started\n"
    child = int(pidfile.read_text())
    assert _dead(child)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its new parent to reap it (killed all the same)."""
    for _ in range(20):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_output_past_the_cap_is_cut_and_marked_truncated() -> None:
    out = run_command([PY, "-c", "import sys; sys.stdout.write('x' * 100000)"], 10, 1000)
    assert out.truncated and len(out.data) == 1000 and out.status == "ok"
    assert out.error == "output cut at 1000 bytes"


def test_read_tail_keeps_the_newest_bytes(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"old\n" * 10 + b"newest\n")
    assert read_tail(f, 7) == (b"newest\n", True)
    assert read_tail(f, 1000) == (f.read_bytes(), False)
    with pytest.raises(ReadError, match="No such file"):
        read_tail(tmp_path / "absent", 10)


def test_a_command_that_writes_its_file_gives_the_file(tmp_path: Path) -> None:
    target = tmp_path / "report.log.gz"
    c = Collector("r", "r.gz", [PY, "-c", f"open({str(target)!r}, 'wb').write(b'data'); print('done')"],
                  produces=target)
    out = run_one(c, 10, 1000)
    assert (out.data, out.status) == (b"data", "ok")
    missing = Collector("m", "m.gz", [PY, "-c", "print('wrote nothing')"], produces=tmp_path / "none")
    out = run_one(missing, 10, 1000)
    assert out.status == "failed" and out.error is not None and "wrote nothing" in out.error


def test_the_deadline_records_a_slow_collector_as_a_timeout_and_keeps_the_others() -> None:
    def slow(cap: int, timeout: float) -> tuple[bytes, bool]:
        time.sleep(5)
        return b"late", False

    def broken(cap: int, timeout: float) -> tuple[bytes, bool]:
        raise RuntimeError("bug in a collector")

    def unreadable(cap: int, timeout: float) -> tuple[bytes, bool]:
        raise ReadError("socket refused")

    collectors = [Collector("slow", "slow", ["slow"], read=slow),
                  Collector("broken", "broken", ["broken"], read=broken),
                  Collector("unreadable", "u", ["u"], read=unreadable),
                  Collector("fast", "fast", [PY, "-c", "print(1)"])]
    t0 = time.monotonic()
    res = run_all(collectors, 10, 1000, deadline_s=1.0)
    assert time.monotonic() - t0 < 3
    assert res["slow"].status == "timeout" and "deadline" in (res["slow"].error or "")
    assert res["broken"].status == "failed" and res["broken"].error == "RuntimeError: bug in a collector"
    assert (res["unreadable"].status, res["unreadable"].error) == ("failed", "socket refused")
    assert (res["fast"].status, res["fast"].data) == ("ok", b"1\n")


def test_a_read_over_its_cap_is_truncated_and_one_over_its_timeout_says_so() -> None:
    big = Collector("big", "big", ["big"], read=lambda cap, t: (b"y" * (cap + 5), False))
    out = run_one(big, 10, 100)
    assert out.truncated and len(out.data) == 100

    def slowish(cap: int, timeout: float) -> tuple[bytes, bool]:
        time.sleep(0.3)
        return b"ok", False

    out = run_one(Collector("s", "s", ["s"], read=slowish, timeout_s=0.1), 10, 100)
    assert out.status == "timeout" and out.data == b"ok"
