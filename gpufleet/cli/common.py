"""Shared CLI plumbing: input errors become a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from gpufleet.core.errors import InputError

P = ParamSpec("P")
R = TypeVar("R")

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def input_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Report InputError as `file: path: message` lines with exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            err_console.print(f"[bold red]invalid input[/] {e.file}", highlight=False, soft_wrap=True)
            for p in e.problems:
                err_console.print(
                    f"  {e.file}: {p.path}: {p.message}", highlight=False, markup=False, soft_wrap=True
                )
            raise typer.Exit(InputError.exit_code) from None

    return wrapper
