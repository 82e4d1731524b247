"""JSON lines files that processes append to (one object per line, each a single O_APPEND write):
the training ranks' events, the storage sandbox's writer and restore events. A line being appended
right now may be torn, not JSON yet: readers skip it; what a complete line means is each reader's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

READ_LIMIT_BYTES = 50_000_000  # a runaway file is read only this far (bounded memory)


def append_objects(path: str | Path, docs: Iterable[Any]) -> None:
    """Append one JSON line per document in a single O_APPEND write (its folder made if missing):
    a concurrent reader sees whole lines, or a torn last one that it skips."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def json_lines(lines: Iterable[str | bytes]) -> Iterator[tuple[int, Any]]:
    """(line number from 1, parsed JSON) of every line that is JSON; blank and torn lines skipped."""
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            yield i, json.loads(raw)
        except ValueError:
            continue  # torn: being appended right now, or cut by a kill


def read_lines(path: str | Path, limit_bytes: int = READ_LIMIT_BYTES) -> list[bytes]:
    """The file's lines, up to `limit_bytes`; none when it does not exist yet."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit_bytes).splitlines()
    except OSError:
        return []


def read_objects(path: str | Path, limit_bytes: int = READ_LIMIT_BYTES) -> list[dict[str, Any]]:
    """The JSON objects of a file, in order (other JSON values and torn lines skipped)."""
    return [doc for _, doc in json_lines(read_lines(path, limit_bytes)) if isinstance(doc, dict)]


def parse_models(lines: Iterable[str | bytes], model: type[M], source: str, noun: str) -> list[M]:
    """`model`s from JSON lines: torn lines skipped; a JSON line that does not fit raises ValueError
    naming `source`, the line number, `noun` and what is wrong."""
    out: list[M] = []
    for i, doc in json_lines(lines):
        try:
            out.append(model.model_validate(doc))
        except ValidationError as e:
            where = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(line)'}: {err['msg']}"
                              for err in e.errors())
            raise ValueError(f"{source}: line {i}: not {noun}: {where}") from None
    return out
