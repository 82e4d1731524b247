"""What the game-day shows on a terminal: a progress display while the suite runs and the verdict
table at the end (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from gpufleet.core.tables import Col, fit_table
from gpufleet.gameday.evaluate import ExperimentResult, Result
from gpufleet.gameday.report.summary import SuiteRun
from gpufleet.gameday.runner import Listener
from gpufleet.gameday.suite import Experiment
from gpufleet.slo import Check

_STYLE = {"PASS": "green", "FAIL": "red", "UNKNOWN": "yellow", "met": "green", "missed": "red",
          "unjudged": "yellow"}


class RichListener(Listener):
    """One suite bar (experiment i of n, elapsed) plus a line per finished experiment."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("game-day", total=None)

    def __enter__(self) -> RichListener:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def suite_started(self, suite: list[Experiment]) -> None:
        self.progress.update(self.task, total=len(suite), description=f"suite of {len(suite)} experiment(s)")

    def sandbox(self, message: str) -> None:
        self.progress.console.print(f"[dim]sandbox:[/] {message}", highlight=False)

    def healed(self, index: int, experiment: Experiment, report: dict[str, Any]) -> None:
        state = "healed" if report["ok"] else "[yellow]NOT healed[/]"
        self.progress.console.print(
            f"[dim]steady state before {experiment.name}:[/] {state} in {report['seconds']} s "
            f"({'; '.join(report['problems'])})", highlight=False,
        )

    def experiment_started(self, index: int, experiment: Experiment) -> None:
        self.progress.update(self.task, description=f"{experiment.name}: starting")

    def tick(self, index: int, experiment: Experiment, elapsed_s: float) -> None:
        self.progress.update(self.task, description=f"{experiment.name}: running {elapsed_s:4.0f} s")

    def experiment_done(self, index: int, result: ExperimentResult) -> None:
        style = _STYLE[result.result.value]
        self.progress.console.print(
            f"[{style}]{result.result_label:>8}[/] {result.name} (verdict {result.verdict.value}, "
            f"expected {result.expected.value}, {result.wall_seconds:.0f} s)", highlight=False,
        )
        self.progress.advance(self.task)


def _cell(check: Check | None) -> str:
    if check is None:
        return "-"
    measured = "?" if check.measured is None else f"{check.measured:.1f}"
    text = measured if check.budget is None else f"{measured}/{check.budget:g}"
    return f"[{_STYLE[check.outcome.value]}]{text}[/]"


# Verdict table columns. At 80 columns (or in a pipe) the expected outcome and the fault class are
# dropped first (both are in the report); the measured times, the verdict and the result - what the
# game-day is for - always stay, and long experiment names and results wrap instead of being cut.
VERDICT_COLUMNS = (
    Col("experiment", wrap=True, min_width=16),
    Col("fault class", drop=1),
    Col("detect s", justify="right"),
    Col("isolate s", justify="right"),
    Col("recover s", justify="right"),
    Col("verdict", drop=2),
    Col("expected", drop=0),
    Col("result", wrap=True, min_width=9, compact_max=9),  # "failed as expected": 2 lines
)


def verdict_rows(run: SuiteRun) -> list[list[str]]:
    rows = []
    for r in run.results:
        checks = {c.name: c for c in r.checks}
        verdict = f"[{_STYLE[r.verdict.value]}]{r.verdict.value}[/]"
        result = f"[{_STYLE[r.result.value]}]{r.result_label}[/]"
        rows.append([
            escape(r.name), escape(r.fault_class or "-"), _cell(checks.get("detect")),
            _cell(checks.get("isolate")), _cell(checks.get("recover")), verdict, r.expected.value, result,
        ])
    for name in run.not_run:
        rows.append([escape(name), "-", "-", "-", "-", "-", "-", "[yellow]not run[/]"])
    return rows


def verdict_table(run: SuiteRun, width: int | None = None) -> Table:
    """The verdict table for a terminal `width` columns wide (None: every column)."""
    title = f"game-day {run.stack} ({run.backend}): {run.outcome}"
    return fit_table(VERDICT_COLUMNS, verdict_rows(run), width or 10_000, title=escape(title))


def explain(run: SuiteRun) -> list[str]:
    """One line per experiment that did not meet its expectation: the first check that says why."""
    lines = []
    for r in run.results:
        if r.result is Result.MET:
            continue
        bad = [c for c in r.checks if c.outcome.value != "PASS"]
        why = f"{bad[0].name}: {bad[0].detail}" if bad else (r.notes[-1] if r.notes else r.verdict.value)
        lines.append(f"{r.name}: {why}")
    return lines
