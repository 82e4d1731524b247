"""What the game-day shows on a terminal: a progress display while the suite runs and the verdict
table at the end (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

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


def verdict_table(run: SuiteRun) -> Table:
    table = Table(title=f"game-day {run.stack} ({run.backend}): {run.outcome}", title_justify="left")
    for col in ("experiment", "fault class", "detect s", "isolate s", "recover s", "verdict", "expected",
                "result"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    for r in run.results:
        checks = {c.name: c for c in r.checks}
        verdict = f"[{_STYLE[r.verdict.value]}]{r.verdict.value}[/]"
        result = f"[{_STYLE[r.result.value]}]{r.result_label}[/]"
        table.add_row(
            r.name, r.fault_class or "-", _cell(checks.get("detect")), _cell(checks.get("isolate")),
            _cell(checks.get("recover")), verdict, r.expected.value, result,
        )
    for name in run.not_run:
        table.add_row(name, "-", "-", "-", "-", "-", "-", "[yellow]not run[/]")
    return table


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
