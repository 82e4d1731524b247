"""gpufleet.core.tables: columns chosen for the width; kept cells are never truncated."""

from __future__ import annotations

import io

from rich.console import Console

from gpufleet.core.tables import Col, cell_width, choose_columns, fit_table, natural_widths, needed_width

COLS = (
    Col("name", wrap=True, min_width=6),
    Col("kind", drop=1),
    Col("code"),
    Col("notes", drop=0),
)
ROWS = [
    ["a-rather-long-name", "[green]fatal[/]", "X79", "reboot the node then replace"],
    ["short", "info", "X45", ""],
]


def render(width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(fit_table(COLS, ROWS, width, title="t"))
    return out.getvalue()


def test_cell_width_ignores_markup() -> None:
    assert cell_width("[green]fatal[/]") == 5
    assert natural_widths(COLS, ROWS) == [18, 5, 4, 28]


def test_every_column_when_it_fits_boxed() -> None:
    assert needed_width(COLS, natural_widths(COLS, ROWS)) == 6 + 5 + 4 + 28 + 3 * 4 + 1
    assert choose_columns(COLS, ROWS, 200) == ([0, 1, 2, 3], False)
    text = render(200)
    assert "a-rather-long-name" in text and "reboot the node then replace" in text and "┃" in text


def test_lowest_drop_goes_first_and_required_columns_stay() -> None:
    # the wrapping name column counts at its minimum (6): boxed 56 wide, compact 52
    assert choose_columns(COLS, ROWS, 56) == ([0, 1, 2, 3], False)
    assert choose_columns(COLS, ROWS, 55) == ([0, 1, 2, 3], True)
    assert choose_columns(COLS, ROWS, 40) == ([0, 1, 2], True)
    assert choose_columns(COLS, ROWS, 20) == ([0, 2], True)
    assert choose_columns(COLS, ROWS, 5) == ([0, 2], True)  # never fewer than the kept ones


def test_narrow_rendering_wraps_names_and_never_truncates() -> None:
    text = render(20)
    lines = text.splitlines()
    assert "…" not in text
    assert all(len(line) <= 20 for line in lines)
    assert lines[1].split() == ["name", "code"]  # kind and notes dropped, and said so
    assert "hidden at this width: kind, notes (all in --output json)" in " ".join(text.split())
    # the kept cells are all there: the code whole, the name folded over two lines
    assert [line.split()[-1] for line in lines[3:6]] == ["X79", "-name", "X45"]
    assert lines[3].split()[0] + lines[4].split()[0] == "a-rather-long-name"
