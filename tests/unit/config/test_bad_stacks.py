"""Every malformed stack file in the corpus yields one clear error naming file and path, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = sorted((Path(__file__).parents[2] / "bad_input" / "stacks").glob("*.yaml"))


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with '# expect: <path>: <message>'"
    return first.removeprefix("# expect: ")


def test_corpus_is_not_empty() -> None:
    assert len(CORPUS) >= 15


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_bad_stack_gives_one_clear_error(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "validate", str(path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith(f"{path}: ")]
    assert len(lines) == 1, proc.stderr  # exactly one problem, naming the file
    assert expected(path) in lines[0], proc.stderr


def test_secret_values_are_never_printed() -> None:
    path = next(p for p in CORPUS if p.stem == "secret-both")
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "validate", str(path)],
        capture_output=True, text=True, timeout=120,
    )
    assert "hunter2" not in proc.stdout + proc.stderr
    assert "v1:abc" not in proc.stdout + proc.stderr
