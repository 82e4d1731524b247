"""Bounded polling: wait for a condition with a deadline, never forever."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class NotReady(TimeoutError):
    pass


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float, interval_s: float = 0.1) -> T:
    """Call `check` until it returns something other than None/False, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except Exception as e:  # a probe failing is "not yet"; keep the last reason for the error
            last_error = e
        if time.monotonic() >= deadline:
            why = f" (last error: {last_error})" if last_error else ""
            raise NotReady(f"timed out after {timeout_s:.0f} s waiting for {what}{why}")
        time.sleep(interval_s)
