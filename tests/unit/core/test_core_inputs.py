"""gpufleet.core.inputs: every user file is read safely (exit-2 InputErrors naming the file, never a
traceback) and output paths are checked before any work."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import pytest

from gpufleet.core.errors import InputError
from gpufleet.core.inputs import (
    MAX_INPUT_BYTES,
    check_output_dir,
    check_output_file,
    read_json,
    read_text,
    read_yaml,
)


def problem(exc: pytest.ExceptionInfo[InputError]) -> str:
    (p,) = exc.value.problems
    return f"{p.path}: {p.message}"


def test_reads_utf8_text_and_drops_a_byte_order_mark(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_bytes("\ufeffname: café\n".encode())
    assert read_text(f) == "name: café\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "(file): is empty"),
        (b" \n\t\n", "(file): is empty"),
        (b"config:\x00\x01\x02", "(file): is a binary file (NUL byte at offset 7), not UTF-8 text"),
        (b"a: 1\nb: caf\xe9\n", "(file): is not UTF-8 text (invalid byte 0xe9 on line 2)"),
    ],
    ids=["empty", "blank", "binary", "latin-1"],
)
def test_bad_content_is_an_input_error_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "stack.yaml"
    f.write_bytes(content)
    with pytest.raises(InputError) as exc:
        read_text(f)
    assert exc.value.file == str(f)
    assert problem(exc) == message
    assert exc.value.exit_code == 2


def test_missing_directory_and_fifo(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        read_text(tmp_path / "nope.json")
    assert problem(exc) == "(file): does not exist"
    with pytest.raises(InputError) as exc:
        read_text(tmp_path)
    assert problem(exc) == "(file): is a directory, not a file"
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError) as exc:  # reading it would block forever
        read_text(fifo)
    assert problem(exc) == "(file): is not a regular file (a device, FIFO or socket)"


def test_size_cap_is_checked_before_reading(tmp_path: Path) -> None:
    assert MAX_INPUT_BYTES == 16 * 1024 * 1024
    big = tmp_path / "huge.json"
    with open(big, "wb") as fh:  # sparse: costs no disk
        fh.truncate(MAX_INPUT_BYTES + 1)
    with pytest.raises(InputError) as exc:
        read_text(big)
    assert problem(exc) == "(file): is 16.0 MiB, larger than the 16.0 MiB an input file may be"
    small = tmp_path / "small.json"
    small.write_text("x" * 101)
    with pytest.raises(InputError) as exc:
        read_text(small, max_bytes=100)
    assert problem(exc) == "(file): is 101 bytes, larger than the 100 bytes an input file may be"
    assert read_text(small, max_bytes=101) == "x" * 101


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    f = tmp_path / "secret.yaml"
    f.write_text("a: 1\n")
    f.chmod(0)
    with pytest.raises(InputError) as exc:
        read_text(f)
    assert problem(exc) == "(file): cannot read: Permission denied"


def test_unreadable_file_when_open_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "secret.yaml"
    f.write_text("a: 1\n")
    real_open = builtins.open

    def deny(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(f):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(InputError) as exc:
        read_text(f)
    assert problem(exc) == "(file): cannot read: Permission denied"


def test_json_and_yaml_syntax_errors_have_line_and_column(tmp_path: Path) -> None:
    j = tmp_path / "e.json"
    j.write_text('{\n  "title": "x",\n  oops\n}\n')
    with pytest.raises(InputError) as exc:
        read_json(j)
    assert problem(exc).startswith("line 3, column 3: invalid JSON: Expecting property name")
    y = tmp_path / "s.yaml"
    y.write_text("a: [1, 2\n")
    with pytest.raises(InputError) as exc:
        read_yaml(y)
    assert problem(exc).startswith("line 2, column 1: invalid YAML:")
    y.write_bytes(b"\x00")
    with pytest.raises(InputError, match="binary"):
        read_yaml(y)


def test_output_dir_checks(tmp_path: Path) -> None:
    check_output_dir(tmp_path, "--report")  # exists, writable
    check_output_dir(tmp_path / "a" / "b", "--report")  # creatable
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError) as exc:
        check_output_dir(f, "--report")
    assert exc.value.file == str(f) and problem(exc) == "--report: exists and is not a directory"
    with pytest.raises(InputError) as exc:
        check_output_dir(f / "sub", "--out")
    assert problem(exc) == f"--out: cannot create it: {f} is not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_output_dir_not_writable(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(InputError, match="not writable"):
        check_output_dir(ro / "report", "--report")


def test_output_file_checks(tmp_path: Path) -> None:
    check_output_file(tmp_path / "new" / "out.json", "--json")
    existing = tmp_path / "out.json"
    existing.write_text("{}")
    check_output_file(existing, "--json")
    with pytest.raises(InputError) as exc:
        check_output_file(tmp_path, "--json")
    assert problem(exc) == "--json: is a directory; give a file name"
    with pytest.raises(InputError) as exc:
        check_output_file(existing / "x.json", "--json")
    assert problem(exc) == f"--json: cannot create it: {existing} is not a directory"
