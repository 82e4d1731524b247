from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.gameday import Experiment, JournalFacts, load_experiment, read_journal, stack_budgets
from gpufleet.slo import Budget

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
REPO = HERE.parents[2]


@pytest.fixture
def experiment() -> Callable[[str], Experiment]:
    return lambda name: load_experiment(FIXTURES / "experiments" / f"{name}.json")


@pytest.fixture
def facts() -> Callable[[str], JournalFacts]:
    return lambda name: read_journal(json.loads((FIXTURES / "journals" / f"{name}.json").read_text()))


@pytest.fixture
def budgets() -> dict[str, Budget]:
    return stack_budgets("sandbox", REPO / "stacks")


@pytest.fixture
def fake_chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable standing in for `chaos`; returns the file where it records its argv."""
    argv_log = tmp_path / "chaos-argv.jsonl"
    exe = tmp_path / "chaos"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_chaos.py'} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("GPUFLEET_CHAOS_BIN", str(exe))
    monkeypatch.setenv("FAKE_CHAOS_ARGV", str(argv_log))
    return argv_log
