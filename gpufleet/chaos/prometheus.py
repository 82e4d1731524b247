"""A small Prometheus HTTP API client (api/v1/alerts, query, query_range), bounded in time."""

from __future__ import annotations

from typing import Any

import httpx
from chaoslib.exceptions import ActivityFailed

TIMEOUT_S = 10.0


def _get(base: str, path: str, params: dict[str, Any] | None = None) -> Any:
    try:
        r = httpx.get(f"{base.rstrip('/')}{path}", params=params, timeout=TIMEOUT_S)
        r.raise_for_status()
        body = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise ActivityFailed(f"Prometheus {base}{path}: {e}") from None
    if body.get("status") != "success":
        raise ActivityFailed(f"Prometheus {path}: {body.get('error', body)}")
    return body["data"]


def firing_alerts(base: str) -> list[dict[str, Any]]:
    data = _get(base, "/api/v1/alerts")
    return [a for a in data.get("alerts", []) if a.get("state") == "firing"]


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    # Prometheus caps a range query at 11,000 points per series: widen the step for long windows.
    step = max(step, (end - start) / 10_000)
    data = _get(base, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})
    result: list[dict[str, Any]] = data.get("result", [])
    return result


def first_sample_time(series: list[dict[str, Any]], at_or_after: float) -> float | None:
    """Earliest sample time at or after `at_or_after` over every series (pure)."""
    times = [float(v[0]) for s in series for v in s.get("values", []) if float(v[0]) >= at_or_after]
    return min(times) if times else None


def alert_firing_since(base: str, alert: str, start: float, end: float, step: float = 1.0) -> float | None:
    """First time the alert was seen firing in [start, end] (ALERTS, resolution `step`)."""
    expr = f'ALERTS{{alertname="{alert}",alertstate="firing"}}'
    return first_sample_time(query_range(base, expr, start, end, step), start)


def instant(base: str, expr: str) -> list[dict[str, Any]]:
    data = _get(base, "/api/v1/query", {"query": expr})
    result: list[dict[str, Any]] = data.get("result", [])
    return result
