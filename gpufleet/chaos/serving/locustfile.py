"""The serving load: a Locust file (`locust -f <this file> --headless ...`), run by gpufleet.chaos.serving.

Each user owns a schedule: one request every 1 / `--gpufleet-rate-per-user` seconds from a random
phase, so the offered load is users x rate whatever the service does. A user waiting on a slow answer
cannot send; each slot it could not send within one interval of when it was due is written as a
missed request, and latency is measured from when the request was due, not from when it left
(coordinated omission: gpufleet.slo.serving). Every slot goes to this process's records file
(gpufleet.core.serving_records, one JSON line each); Locust's own statistics are not used for the
verdict (its percentiles are a ~10 s sliding window).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import IO, Any

from locust import FastHttpUser, events, task

from gpufleet.core.serving_records import RequestLine

_records: list[IO[str]] = []


def _options(parser: Any) -> None:
    parser.add_argument("--gpufleet-records", type=str, default="", help="directory for requests-<pid>.jsonl")
    parser.add_argument(
        "--gpufleet-rate-per-user", type=float, default=1.0, help="requests per second per user"
    )
    parser.add_argument("--gpufleet-request-timeout", type=float, default=5.0, help="seconds")


def _open(environment: Any, **_: Any) -> None:
    opts = environment.parsed_options
    if not opts.gpufleet_records:
        raise SystemExit("--gpufleet-records is required")
    if opts.gpufleet_rate_per_user <= 0:
        raise SystemExit("--gpufleet-rate-per-user must be > 0")
    d = Path(opts.gpufleet_records)
    d.mkdir(parents=True, exist_ok=True)
    _records.append(open(d / f"requests-{os.getpid()}.jsonl", "a", buffering=1))  # noqa: SIM115


def _close(**_: Any) -> None:
    for fh in _records:
        fh.close()
    _records.clear()


def _write(line: RequestLine) -> None:
    for fh in _records:
        fh.write(line.line())


class InferenceUser(FastHttpUser):
    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.interval = 1.0 / opts.gpufleet_rate_per_user
        self.network_timeout = self.connection_timeout = opts.gpufleet_request_timeout
        self.next_slot = time.time() + random.uniform(0, self.interval)

    def wait_time(self) -> float:
        return max(0.0, self.next_slot - time.time())

    def _miss_until(self, now: float) -> None:
        # A slot not sent within one interval of when it was due was missed: the user was waiting.
        while self.next_slot + self.interval <= now:
            _write(RequestLine(t=round(self.next_slot, 6), ok=False, missed=True))
            self.next_slot += self.interval

    @task
    def infer(self) -> None:
        now = time.time()
        if now < self.next_slot:  # Locust runs a user's first task without waiting first
            time.sleep(self.next_slot - now)  # gevent's sleep: Locust patches the standard library
        self._miss_until(time.time())
        due = self.next_slot
        self.next_slot += self.interval
        with self.client.post("/v1/infer", data="", name="infer", catch_response=True) as resp:
            ok = resp.status_code == 200
            error = None if ok else (str(resp.error) if resp.error else f"HTTP {resp.status_code}")
            if not ok:
                resp.failure(error)
            replica = resp.headers.get("X-Replica") if resp.headers else None
        _write(
            RequestLine(
                t=round(due, 6),
                latency_s=round(time.time() - due, 6),
                ok=ok,
                status=resp.status_code or 0,
                replica=replica,
                error=error,
            )
        )

    def on_stop(self) -> None:
        self._miss_until(time.time())


# Registered by call, not as decorators: Locust's event hooks are untyped.
events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]
events.test_start.add_listener(_open)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_close)  # type: ignore[no-untyped-call]
