"""The Prometheus HTTP API (v1) calls the project makes, in one client: readiness, instant and
range queries, alerts, targets and rule groups. Every call is bounded in time; a failure raises
PrometheusError naming the call (callers turn it into their own error: an ActivityFailed in the
chaos extension, a SandboxError in the sandbox)."""

from __future__ import annotations

from typing import Any

import httpx

# A range query returns at most 11,000 points per series (Prometheus HTTP API, "Range queries").
MAX_POINTS = 10_000


class PrometheusError(RuntimeError):
    pass


class PrometheusClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ready(self) -> bool:
        try:
            return self._http.get(f"{self.url}/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            r = self._http.get(f"{self.url}{path}", params=params)
            r.raise_for_status()
            body = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise PrometheusError(f"Prometheus {self.url}{path}: {e}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error", body) if isinstance(body, dict) else body
            raise PrometheusError(f"Prometheus {path}: {why}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/query", {"query": expr}).get("result", []))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        step = max(step, (end - start) / MAX_POINTS)
        params = {"query": expr, "start": start, "end": end, "step": step}
        return list(self._get("/api/v1/query_range", params).get("result", []))

    def alerts(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/alerts").get("alerts", []))

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", {"state": "active"})["activeTargets"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules")["groups"])
