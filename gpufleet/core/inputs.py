"""Reading user files at the edge: text read safely (size cap, no binary, UTF-8 only), YAML and
JSON with line/column errors, and pydantic errors turned into `path: message` problems without
echoing input values (they may be secrets). One place for every loader (stacks, catalog, scenarios,
experiments, game-day reports, promtool fixtures, runbook notes), and for the checks of output
paths made before a command starts its work."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.core.errors import InputError, Problem, format_path
from gpufleet.core.yamlio import safe_load

M = TypeVar("M", bound=BaseModel)

_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
    "too_short": "at least",
}


def problems_from_validation(
    exc: ValidationError,
    prefix: Sequence[str | int] = (),
    union_tags: Collection[str] = (),
) -> list[Problem]:
    """Path + message for every pydantic error. `union_tags` are discriminator values pydantic adds
    to locations of tagged unions: they are dropped so the path names the field."""
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        loc = [p for i, p in enumerate(loc) if i == 0 or p not in union_tags]
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind in _BOUNDS and ctx:
            msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
        if "[key]" in loc:
            # pydantic reports a bad mapping key as <key>.[key]: name the key itself.
            loc = loc[: loc.index("[key]")]
            msg = f"invalid key: {msg}"
        out.append(Problem(format_path([*prefix, *loc]), msg))
    return out


# The largest input a user hands the CLI: the whole packaged fault catalog is ~100 KiB and a game-day
# summary.json of a long suite ~1 MiB. 16 MiB leaves two orders of magnitude of room while refusing,
# before reading it into memory, what is certainly a mistake (a log, a core dump, a disk image passed
# by accident). Loaders build a whole document in memory, so the cap is also a memory bound.
MAX_INPUT_BYTES = 16 * 1024 * 1024

_FILE = "(file)"


def _refuse(path: Path | str, message: str) -> InputError:
    return InputError(str(path), [Problem(_FILE, message)])


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def read_text(path: Path | str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of a user-supplied file, or an InputError naming the file and saying what is wrong:
    missing, a directory or other non-regular file (a FIFO would block), unreadable, larger than
    `max_bytes`, binary (NUL bytes), not UTF-8, or empty. A UTF-8 byte-order mark is dropped."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise _refuse(p, "does not exist") from None
    except OSError as e:
        raise _refuse(p, f"cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(p, "is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(p, "is not a regular file (a device, FIFO or socket)")
    if st.st_size > max_bytes:
        raise _refuse(p, f"is {_size(st.st_size)}, larger than the {_size(max_bytes)} an input file may be")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)  # the file may have grown since stat()
    except OSError as e:
        raise _refuse(p, f"cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise _refuse(p, f"is larger than the {_size(max_bytes)} an input file may be")
    nul = data.find(b"\0")
    if nul >= 0:
        raise _refuse(p, f"is a binary file (NUL byte at offset {nul}), not UTF-8 text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _refuse(p, f"is not UTF-8 text (invalid byte 0x{data[e.start]:02x} on line {line})") from None
    if not text.strip():
        raise _refuse(p, "is empty")
    return text


def read_json(path: Path | str) -> Any:
    """Parse a JSON file read with read_text; syntax errors become InputErrors (line, column)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
        raise InputError(str(path), [Problem(where, f"invalid JSON: {e.msg}")]) from None
    except RecursionError:
        raise _refuse(path, "invalid JSON: nested too deeply") from None


def read_yaml(path: Path) -> Any:
    """Parse a YAML file read with read_text; syntax errors become InputErrors (line, column)."""
    text = read_text(path)
    try:
        return safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(str(path), [Problem(where, f"invalid YAML: {problem}")]) from None


def validate(model: type[M], data: Any, file: str, union_tags: Collection[str] = ()) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputError(file, problems_from_validation(e, union_tags=union_tags)) from None


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Read a YAML file into a pydantic model; every problem is reported with its path."""
    return validate(model, read_yaml(path), str(path))


def _first_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_dir(d: Path) -> bool:
    return os.access(d, os.W_OK | os.X_OK)


def _creatable(path: Path, option: str) -> None:
    """`path` does not exist: its nearest existing ancestor must be a writable directory."""
    base = _first_existing(path)
    if not base.is_dir():
        raise InputError(str(path), [Problem(option, f"cannot create it: {base} is not a directory")])
    if not _writable_dir(base):
        raise InputError(str(path), [Problem(option, f"cannot create it: {base} is not writable")])


def check_output_dir(path: Path, option: str) -> None:
    """Before any work: `path` (given with `option`, e.g. --report) is a directory that exists and is
    writable, or can be created under a writable directory. InputError otherwise."""
    if path.exists():
        if not path.is_dir():
            raise InputError(str(path), [Problem(option, "exists and is not a directory")])
        if not _writable_dir(path):
            raise InputError(str(path), [Problem(option, "directory is not writable")])
        return
    _creatable(path, option)


def check_output_file(path: Path, option: str) -> None:
    """Before any work: `path` (given with `option`, e.g. --json) can be written as a file: not a
    directory, writable if it exists, else its nearest existing parent is a writable directory."""
    if path.is_dir():
        raise InputError(str(path), [Problem(option, "is a directory; give a file name")])
    if path.exists():
        if not os.access(path, os.W_OK):
            raise InputError(str(path), [Problem(option, "file is not writable")])
        return
    _creatable(path, option)
