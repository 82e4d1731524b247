"""The single-file HTML report: a table of measured times against budgets and one embedded
timeline plot per experiment (jinja2, autoescaped)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jinja2

from gpufleet.gameday.evaluate import ExperimentResult, Result
from gpufleet.gameday.report.plots import serving_png, timeline_png
from gpufleet.gameday.report.summary import SuiteRun
from gpufleet.slo import Check, Outcome


@dataclass(frozen=True)
class Cell:
    text: str
    outcome: str  # CSS class: the check's outcome, "" when not judged


@dataclass(frozen=True)
class Row:
    r: ExperimentResult
    cells: tuple[Cell, ...]
    return_text: str
    lost_text: str
    png: str
    avail_text: str = "-"
    css: str = ""  # CSS class of the result: met / missed / unjudged / expected-failure
    capacity: dict[str, Any] | None = None
    serving_png: str | None = None


def _cell(checks: dict[str, Check], name: str) -> Cell:
    c = checks.get(name)
    if c is None:
        return Cell("not judged", "")
    measured = "?" if c.measured is None else f"{c.measured:.1f}"
    if c.budget is None:
        text = measured if c.outcome is not Outcome.PASS or c.measured is not None else "stayed"
    else:
        text = f"{measured} / {c.budget:g}"
    return Cell(text, c.outcome.value)


def _row(r: ExperimentResult) -> Row:
    checks = {c.name: c for c in r.checks}
    m = r.measurement
    ret = "-" if m is None or m.time_to_return is None else f"{m.time_to_return:.1f}"
    lost = "-" if m is None or m.lost_steps is None else str(m.lost_steps)
    cells = tuple(_cell(checks, n) for n in ("detect", "isolate", "recover"))
    avail = "-" if m is None or m.availability is None else f"{m.availability:.2%}"
    css = "expected-failure" if r.expected_failure else r.result.value
    cap = r.extra.get("capacity")
    return Row(r, cells, ret, lost, timeline_png(r), avail, css, cap if isinstance(cap, dict) else None,
               serving_png(r) if r.serving is not None else None)


def _unit(name: str) -> str:
    """How a check's figures read: seconds, except the serving checks' shares and milliseconds."""
    if name in ("serving-availability", "serving-window-availability"):
        return "share"
    return "ms" if name == "serving-window-p99-ms" else "s"


def _figure(value: float | None, unit: str, budget: bool) -> str:
    if value is None:
        return "-"
    if unit == "share":
        return f"{value:.3%}" if not budget else f">= {value:.2%}"
    text = f"{value:g} {unit}" if budget else f"{value:.2f} {unit}"
    return text if not budget or unit == "s" else f"<= {text}"


def measured_text(c: Check) -> str:
    return _figure(c.measured, _unit(c.name), budget=False)


def budget_text(c: Check) -> str:
    return _figure(c.budget, _unit(c.name), budget=True)


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("gpufleet.gameday", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["measured_text"] = measured_text
_ENV.filters["budget_text"] = budget_text


def html_report(run: SuiteRun) -> str:
    counts = {k.value: sum(1 for r in run.results if r.result is k) for k in Result}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(run.started_at))
    return _ENV.get_template("report.html.j2").render(
        run=run, rows=[_row(r) for r in run.results], counts=counts, started=started,
        expected_failures=[r.name for r in run.results if r.expected_failure],
    )
