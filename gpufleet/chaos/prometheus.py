"""The chaos extension's Prometheus calls: gpufleet.core.promapi with its errors as ActivityFailed,
and the pure helpers the timeline needs (first firing sample)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from chaoslib.exceptions import ActivityFailed

from gpufleet.core.promapi import PrometheusClient, PrometheusError

T = TypeVar("T")

TIMEOUT_S = 10.0


def _call(base: str, fn: Callable[[PrometheusClient], T]) -> T:
    with PrometheusClient(base, TIMEOUT_S) as c:
        try:
            return fn(c)
        except PrometheusError as e:
            raise ActivityFailed(str(e)) from None


def firing_alerts(base: str) -> list[dict[str, Any]]:
    return [a for a in _call(base, PrometheusClient.alerts) if a.get("state") == "firing"]


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    return _call(base, lambda c: c.query_range(expr, start, end, step))


def first_sample_time(series: list[dict[str, Any]], at_or_after: float) -> float | None:
    """Earliest sample time at or after `at_or_after` over every series (pure)."""
    times = [float(v[0]) for s in series for v in s.get("values", []) if float(v[0]) >= at_or_after]
    return min(times) if times else None


def alert_firing_since(base: str, alert: str, start: float, end: float, step: float = 1.0) -> float | None:
    """First time the alert was seen firing in [start, end] (ALERTS, resolution `step`)."""
    expr = f'ALERTS{{alertname="{alert}",alertstate="firing"}}'
    return first_sample_time(query_range(base, expr, start, end, step), start)


def instant(base: str, expr: str) -> list[dict[str, Any]]:
    return _call(base, lambda c: c.query(expr))
