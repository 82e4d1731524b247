"""Shared CLI plumbing: input errors become a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gpufleet.core.errors import InputError

P = ParamSpec("P")
R = TypeVar("R")

console = Console()
err_console = Console(stderr=True)


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


OutputOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--output", "-o", help="table (for people) or json (for scripts: plain JSON on stdout, no markup)."
    ),
]


def _strict(data: Any) -> Any:
    """NaN and infinities are not JSON (RFC 8259): null instead, e.g. an MTBF with no failure seen."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _strict(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_strict(v) for v in data]
    return data


def print_json(data: Any) -> None:
    """One JSON document on stdout, without rich markup, colour or wrapping (pipes and scripts)."""
    typer.echo(json.dumps(_strict(data), indent=2, default=str, allow_nan=False))


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def print_input_error(e: InputError) -> None:
    """`invalid input <file>` and one `file: path: message` line per problem, on stderr."""
    err_console.print(f"[bold red]invalid input[/] {escape(e.file)}", highlight=False, soft_wrap=True)
    for p in e.problems:
        err_console.print(f"  {e.file}: {p.path}: {p.message}", highlight=False, markup=False, soft_wrap=True)


def input_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Report InputError as `file: path: message` lines with exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            print_input_error(e)
            raise typer.Exit(InputError.exit_code) from None

    return wrapper


def cluster_client(stack: str, kubeconfig: Path | None, sandbox_default: bool) -> object:
    """A Kubernetes client: `kubeconfig`, else (with `sandbox_default`) the admin of the stack's
    Kubernetes sandbox, else $KUBECONFIG, ~/.kube/config or the pod's service account; exit 2 when
    none reaches a cluster."""
    from gpufleet.core.kube_client import KubeClientError, kube_client
    from gpufleet.core.sandbox_contract import read_kube_state

    if kubeconfig is None and sandbox_default:
        try:
            admin = read_kube_state(stack).admin_kubeconfig
        except (OSError, ValueError):
            admin = None  # no Kubernetes sandbox of this stack: the default kubeconfig or in-cluster
        kubeconfig = Path(admin) if admin else None
    try:
        return kube_client(kubeconfig)
    except KubeClientError as e:
        raise fail(f"no Kubernetes cluster to reach: {e}", 2) from None
