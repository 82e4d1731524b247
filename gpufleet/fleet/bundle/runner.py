"""Run a bundle's collectors at once, each bounded in time and in output, under one deadline.

A collector is a command (argv) or a read (a Python callable given its byte cap and timeout).
One that fails, hangs or floods is recorded as such and never hides the others: every collector
gets its own thread, and the bundle is written with whatever finished by the deadline.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.fleet.bundle.model import Status

CHUNK = 65536


class ReadError(Exception):
    """A read collector could not read its source; the message says why."""


@dataclass(frozen=True)
class Output:
    """What a collector produced."""

    data: bytes
    status: Status
    exit_status: int | None
    duration_s: float
    truncated: bool = False
    error: str | None = None


# A read: (byte cap, timeout in seconds) -> (data, truncated). Raises ReadError.
Read = Callable[[int, float], tuple[bytes, bool]]


@dataclass(frozen=True)
class Collector:
    name: str  # stable id, e.g. "agent-state"
    member: str  # file name inside the archive
    command: Sequence[str]  # argv of a command, or a description of a read
    read: Read | None = None  # a read collector; None: run `command`
    produces: Path | None = None  # the command writes this file: it is the member (stdout otherwise)
    timeout_s: float | None = None  # overrides the bundle's per-collector timeout
    env: dict[str, str] | None = field(default=None, compare=False)


def run_command(argv: Sequence[str], timeout_s: float, cap: int, env: dict[str, str] | None = None) -> Output:
    """Run argv with stdout+stderr captured up to `cap` bytes; kill its process group at the timeout or
    when the output passes the cap (truncated, like `head -c`)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    except OSError as e:
        return Output(b"", "failed", None, time.monotonic() - t0,
                      error=f"{argv[0]}: {e.strerror or e}")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = bytearray()
    truncated = timed_out = False
    deadline = t0 + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            room = cap - len(buf)
            buf += chunk[:room]
            if len(chunk) > room:
                truncated = True
                break
    finally:
        if timed_out or truncated:
            _kill_group(proc)
        proc.stdout.close()
    try:
        rc: int | None = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        timed_out, rc = True, None
    took = time.monotonic() - t0
    if timed_out:
        return Output(bytes(buf), "timeout", None, took, truncated,
                      error=f"killed after {timeout_s:g} s")
    if truncated:
        # We stopped it: its exit status is our kill, not its answer.
        return Output(bytes(buf), "ok", None, took, True, error=f"output cut at {cap} bytes")
    status: Status = "ok" if rc == 0 else "failed"
    return Output(bytes(buf), status, rc, took, False, error=None if rc == 0 else f"exit status {rc}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # start_new_session made the child a group leader: its own children (nvidia-bug-report.sh runs
    # many) go with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_produced(c: Collector, timeout_s: float, cap: int) -> Output:
    """A command that writes its output file (nvidia-bug-report.sh): the file is the member; the
    command's own output only explains a failure."""
    assert c.produces is not None
    out = run_command(c.command, timeout_s, cap, c.env)
    try:
        data, truncated = read_tail(c.produces, cap)
    except ReadError as e:
        err = out.error or str(e)
        tail = out.data[-500:].decode(errors="replace").strip()
        return Output(out.data, "failed" if out.status == "ok" else out.status, out.exit_status,
                      out.duration_s, out.truncated, error=f"{err}: {tail}" if tail else err)
    return Output(data, out.status, out.exit_status, out.duration_s, truncated, out.error)


def read_tail(path: Path, cap: int) -> tuple[bytes, bool]:
    """The last `cap` bytes of a file (a log's newest lines matter most), and whether it was longer."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > cap:
                fh.seek(size - cap)
                return fh.read(cap), True
            return fh.read(), False
    except OSError as e:
        raise ReadError(f"{path}: {e.strerror or e}") from None


def run_one(c: Collector, timeout_s: float, cap: int) -> Output:
    t = c.timeout_s if c.timeout_s is not None else timeout_s
    if c.read is None:
        if c.produces is not None:
            return run_produced(c, t, cap)
        return run_command(c.command, t, cap, c.env)
    t0 = time.monotonic()
    try:
        data, truncated = c.read(cap, t)
    except ReadError as e:
        return Output(b"", "failed", None, time.monotonic() - t0, error=str(e))
    took = time.monotonic() - t0
    if len(data) > cap:
        data, truncated = data[:cap], True
    if took > t:
        # A read cannot be killed mid-call; one that overran its timeout is kept but said to have.
        return Output(data, "timeout", None, took, truncated, error=f"took {took:.1f} s, over {t:g} s")
    return Output(data, "ok", None, took, truncated)


def run_all(collectors: Sequence[Collector], timeout_s: float, cap: int, deadline_s: float
            ) -> dict[str, Output]:
    """Every collector at once; one still running at the deadline is recorded as a timeout."""
    results: dict[str, Output] = {}
    lock = threading.Lock()

    def work(c: Collector) -> None:
        try:
            out = run_one(c, timeout_s, cap)
        except Exception as e:  # one collector's bug must not lose the bundle
            out = Output(b"", "failed", None, 0.0, error=f"{type(e).__name__}: {e}")
        with lock:
            results[c.name] = out

    t0 = time.monotonic()
    threads = [threading.Thread(target=work, args=(c,), daemon=True, name=f"bundle-{c.name}")
               for c in collectors]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, t0 + deadline_s - time.monotonic()))
    with lock:
        done = dict(results)
    for c in collectors:
        if c.name not in done:
            done[c.name] = Output(b"", "timeout", None, time.monotonic() - t0,
                                  error=f"still running at the bundle's {deadline_s:g} s deadline")
    return done
