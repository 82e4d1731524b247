"""The game-day verdict table stays readable on an 80-column terminal and in a pipe: measured times,
verdict and result always shown whole; long names wrap; low-value columns go first."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpufleet.gameday.console import verdict_table
from gpufleet.gameday.evaluate import ExperimentResult, Result
from gpufleet.gameday.report.summary import SuiteRun
from gpufleet.slo import Check, Outcome


def result(name: str, fault_class: str, verdict: Outcome, expected: Outcome, res: Result,
           times: tuple[float | None, float | None, float | None]) -> ExperimentResult:
    budgets = (15.0, 30.0, 120.0)
    checks = tuple(
        Check(n, t, b, Outcome.UNKNOWN if t is None else (Outcome.PASS if t <= b else Outcome.FAIL), "")
        for n, t, b in zip(("detect", "isolate", "recover"), times, budgets, strict=True)
    )
    return ExperimentResult(
        name=name, title=name, file=f"{name}.json", fault_id=None, fault_class=fault_class,
        status="completed", outcome=verdict, verdict=verdict, expected=expected, result=res,
        checks=checks, measurement=None, budget=None, budget_source="stack", notes=(), timeline=None,
        journal=None, started_at=0.0, wall_seconds=42.0,
    )


RUN = SuiteRun(
    stack="sandbox", backend="sandbox", started_at=0.0, wall_seconds=300.0, setup_seconds=10.0,
    results=(
        result("gpu-xid45-burst-after-crash", "gpu-contained", Outcome.PASS, Outcome.PASS, Result.MET,
               (1.2, 2.5, 39.7)),
        result("storage-checkpoint-outage", "storage-outage", Outcome.FAIL, Outcome.PASS, Result.MISSED,
               (3.0, None, 130.5)),
        result("recovery-budget-breach", "node-crash", Outcome.FAIL, Outcome.FAIL, Result.MET,
               (12.0, 14.0, 121.0)),
    ),
    planned=("gpu-xid45-burst-after-crash", "storage-checkpoint-outage", "recovery-budget-breach",
             "two-nodes-spare-exhausted"),
)


def render(width: int, is_tty: bool = True) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=is_tty, color_system=None)
    console.print(verdict_table(RUN, console.width))
    return out.getvalue()


def test_wide_terminal_shows_every_column() -> None:
    text = render(200)
    header = next(line for line in text.splitlines() if "experiment" in line)
    for col in ("experiment", "fault class", "detect s", "isolate s", "recover s", "verdict", "expected",
                "result"):
        assert col in header
    assert "gpu-xid45-burst-after-crash" in text and "storage-outage" in text
    assert "failed as expected" in text and "hidden at this width" not in text


@pytest.mark.parametrize("is_tty", [True, False], ids=["terminal", "pipe"])
def test_80_columns_keeps_times_verdict_and_result_whole(is_tty: bool) -> None:
    text = render(80, is_tty)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    assert "…" not in text
    header = next(line for line in lines if "experiment" in line)
    assert header.split() == ["experiment", "detect", "s", "isolate", "s", "recover", "s", "verdict",
                              "result"]
    for cell in ("1.2/15", "2.5/30", "39.7/120", "?/30", "130.5/120", "121.0/120", "PASS", "FAIL", "met",
                 "missed", "not run"):
        assert cell in text, cell
    # the first column, read down: every name is there whole, folded over lines
    first = "".join(line.split()[0] for line in lines[3:] if line[:1].strip() and "hidden" not in line)
    for name in [r.name for r in RUN.results] + ["two-nodes-spare-exhausted"]:
        assert name in first, (name, first)
    assert "hidden at this width: fault class, expected" in " ".join(text.split())


def test_a_pipe_gets_the_80_column_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich gives a console that is not a terminal 80 columns unless COLUMNS says otherwise
    monkeypatch.delenv("COLUMNS", raising=False)
    assert Console(file=io.StringIO(), force_terminal=False).width == 80


def test_width_none_is_every_column() -> None:
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(verdict_table(RUN))
    assert "fault class" in out.getvalue() and "expected" in out.getvalue()


def test_json_output_is_the_summary_document() -> None:
    # the summary JSON of the same run is what --output json prints (gameday_cmds)
    from gpufleet.gameday.report.summary import summary_dict

    doc = summary_dict(RUN)
    assert [e["name"] for e in doc["experiments"]] == [r.name for r in RUN.results]
