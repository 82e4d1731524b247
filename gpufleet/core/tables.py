"""Tables that stay readable at the width they are printed at (an 80-column terminal, a pipe).

Rich shrinks every column of a table that is too wide, which turns short codes into "fabric…" or
folds them into nothing. Instead, each table declares its columns once: which must stay, which may
wrap (long free text, e.g. names) and in which order the others are dropped when the width is
short. `fit_table` then picks the columns for the width and never truncates a kept cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.table import Table
from rich.text import Text

# What a rich table spends outside its cells. Boxed (the default look): one space of padding on
# each side of every cell, a rule between columns and at both edges: 3 per column + 1. Compact (used
# when the boxed table would not fit): no edges, no outer padding: 3 per column - 3.
_BOXED = (3, 1)
_COMPACT = (3, -3)


@dataclass(frozen=True)
class Col:
    """One column. `drop`: None keeps it at any width; otherwise the column with the lowest value is
    dropped first when the table does not fit. `wrap`: the cells may fold onto several lines, down to
    `min_width` characters; other columns never wrap and are never truncated. `compact_max`: in a
    compact (narrow) table, a wrapping column no wider than this, leaving the room to the others."""

    header: str
    drop: int | None = None
    wrap: bool = False
    min_width: int = 12
    justify: Literal["left", "right"] = "left"
    compact_max: int | None = None


def cell_width(cell: str) -> int:
    """Printed width of a cell written in rich markup (`[green]PASS[/]` is 4 wide)."""
    return Text.from_markup(cell).cell_len


def natural_widths(cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [cell_width(c.header) for c in cols]
    for row in rows:
        for i, cell in enumerate(row):
            # a multi-line cell is as wide as its widest line
            widths[i] = max(widths[i], *(cell_width(line) for line in cell.split("\n")))
    return widths


def needed_width(cols: Sequence[Col], widths: Sequence[int], compact: bool = False) -> int:
    """Narrowest rendering of these columns: wrapping columns at their minimum."""
    per_column, edge = _COMPACT if compact else _BOXED
    body = sum(min(w, c.min_width) if c.wrap else w for c, w in zip(cols, widths, strict=True))
    return body + per_column * len(cols) + edge


def choose_columns(
    cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int
) -> tuple[list[int], bool]:
    """The columns to show at `width` and whether the table is compact: every column boxed when that
    fits, else compact, dropping droppable columns by ascending `drop` until it fits (or only the
    columns that always stay are left)."""
    widths = natural_widths(cols, rows)
    keep = list(range(len(cols)))
    if needed_width(cols, widths) <= width:
        return keep, False
    droppable = sorted((c.drop, i) for i, c in enumerate(cols) if c.drop is not None)
    while droppable and needed_width([cols[i] for i in keep], [widths[i] for i in keep], True) > width:
        _, i = droppable.pop(0)
        keep.remove(i)
    return keep, True


def fit_table(
    cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int, title: str | None = None
) -> Table:
    """A rich Table of the columns that fit `width` (see choose_columns). Kept non-wrapping columns
    get their natural width as minimum so rich never truncates them; wrapping ones fold."""
    keep, compact = choose_columns(cols, rows, width)
    widths = natural_widths(cols, rows)
    dropped = [cols[i].header for i in range(len(cols)) if i not in keep]
    caption = f"hidden at this width: {', '.join(dropped)} (all in --output json)" if dropped else None
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    if compact:
        table.box, table.show_edge, table.pad_edge = box.SIMPLE_HEAD, False, False
    for i in keep:
        c = cols[i]
        if c.wrap:
            narrowest = min(c.min_width, widths[i])
            widest = c.compact_max if compact else None
            table.add_column(c.header, justify=c.justify, overflow="fold", min_width=narrowest,
                             max_width=widest)
        else:
            table.add_column(c.header, justify=c.justify, no_wrap=True, min_width=widths[i])
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
