"""Run the serving load (Locust, headless, bounded) and turn its records into per-second bins.

Locust runs as a subprocess with this package's locustfile: a fixed number of users, all spawned at
once, a run time after which it stops by itself, and a stop timeout; every bound is checked here
before anything starts. In the sandbox it runs inside the head namespace against the balancer
(`netns`), so its traffic never leaves the sandbox's namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.serving_records import RequestLine, read_records
from gpufleet.slo.serving import Bin, RequestRecord, bin_records, merge_bins

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
MAX_USERS = 200
MAX_DURATION_S = 900.0
MAX_RATE = 2_000.0  # requests per second over all users


@dataclass(frozen=True)
class LoadSpec:
    url: str  # the balancer, e.g. http://10.77.0.1:8080
    users: int
    rate_per_user: float
    duration_s: float
    request_timeout_s: float = 5.0
    stop_timeout_s: float = 5.0

    def problems(self) -> list[str]:
        out = []
        if not self.url.startswith("http://"):
            out.append(f"url must be http://HOST:PORT, got {self.url!r}")
        if not 1 <= self.users <= MAX_USERS:
            out.append(f"users must be 1..{MAX_USERS}, got {self.users}")
        if not self.rate_per_user > 0 or self.users * self.rate_per_user > MAX_RATE:
            out.append(f"rate must be > 0 and users x rate <= {MAX_RATE:g}/s, got "
                       f"{self.users} x {self.rate_per_user:g}")
        if not 1 <= self.duration_s <= MAX_DURATION_S:
            out.append(f"duration must be 1..{MAX_DURATION_S:g} s, got {self.duration_s:g}")
        if not 0 < self.request_timeout_s <= 60 or not 0 < self.stop_timeout_s <= 60:
            out.append("request and stop timeouts must be in (0, 60] s")
        return out

    @property
    def offered_rate(self) -> float:
        return self.users * self.rate_per_user


def locust_argv(spec: LoadSpec, records_dir: Path, python: str = sys.executable) -> list[str]:
    """The Locust command line for `spec` (pure)."""
    bad = spec.problems()
    if bad:
        raise ValueError("; ".join(bad))
    return [
        python, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--host", spec.url, "--users", str(spec.users), "--spawn-rate", str(spec.users),
        "--run-time", f"{spec.duration_s:g}s", "--stop-timeout", f"{spec.stop_timeout_s:g}",
        # The verdict is ours (gpufleet.slo.serving): failed requests must not make Locust's exit fail.
        "--exit-code-on-error", "0", "--loglevel", "WARNING",
        "--gpufleet-records", str(records_dir), "--gpufleet-rate-per-user", f"{spec.rate_per_user:g}",
        "--gpufleet-request-timeout", f"{spec.request_timeout_s:g}",
    ]


def start(spec: LoadSpec, records_dir: Path, log: Path, netns: str | None = None) -> subprocess.Popen[bytes]:
    """Start Locust in the background (its own process group, so a stop reaches every process)."""
    argv = locust_argv(spec, records_dir)
    if netns is not None:
        argv = [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", netns, *argv]
    records_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait(proc: subprocess.Popen[bytes], spec: LoadSpec, grace_s: float = 30.0) -> int:
    """Wait for Locust to stop by itself (run time + stop timeout + start-up grace); past that,
    stop it: SIGTERM to its group, then SIGKILL. Returns its exit status."""
    try:
        return proc.wait(timeout=spec.duration_s + spec.stop_timeout_s + grace_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        return proc.wait()


def stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, patience in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            continue


@dataclass
class LoadRun:
    """A load started by an experiment: stopped with its run (engine.RunState.stop), whatever ends
    the run (normal end, abort, Ctrl-C, SIGTERM); Locust's own run time bounds it after a crash."""

    spec: LoadSpec
    proc: subprocess.Popen[bytes]
    records_dir: Path
    log: Path
    started_at: float  # wall clock

    def finish(self, grace_s: float = 30.0) -> int:
        """Wait for Locust to end by itself (bounded), stopping it past that."""
        return wait(self.proc, self.spec, grace_s)

    def stop(self) -> None:
        stop(self.proc)


def to_record(line: RequestLine) -> RequestRecord:
    return RequestRecord(line.t, line.latency_s, line.ok, line.missed)


def bins(records_dir: Path, origin: float) -> dict[int, Bin]:
    """Per-second bins of every Locust process's records, merged (never averaged)."""
    per_process = [bin_records((to_record(r) for r in lines), origin)
                   for lines in read_records(records_dir).values()]
    return merge_bins(*per_process)


def failure_reason(line: RequestLine) -> str | None:
    """Why a request failed, as a short key (None: it succeeded): `missed`, `HTTP <status>` for an
    answer, else the client's error (no answer: connection refused, reset, timed out)."""
    if line.ok:
        return None
    if line.missed:
        return "missed"
    if line.status:
        return f"HTTP {line.status}"
    return (line.error or "no answer")[:120]


def failure_reasons(records_dir: Path) -> dict[str, int]:
    """How many requests failed for each reason, over every Locust process's records."""
    out: Counter[str] = Counter()
    for lines in read_records(records_dir).values():
        out.update(r for line in lines if (r := failure_reason(line)) is not None)
    return dict(out.most_common())
