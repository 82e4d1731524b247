"""Input errors that name the file, the path inside it and what is wrong.

Validation at the edge collects every problem at once (STYLE.md point 7); the CLI prints them and
exits with code 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def format_path(loc: Sequence[str | int]) -> str:
    """Render a location tuple as ``nodePools[1].gpusPerNode``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out or "(top level)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one value of an input file."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InputError(Exception):
    """A user-supplied file is invalid; carries every problem found in it."""

    exit_code = 2

    def __init__(self, file: str, problems: Iterable[Problem]) -> None:
        self.file = file
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.file}: {len(self.problems)} problem(s)"]
        lines += [f"  {self.file}: {p}" for p in self.problems]
        return "\n".join(lines)
