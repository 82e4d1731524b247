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
    fake = f"{sys.executable} {HERE / 'fake_chaos.py'}"
    # "hang": trap SIGUSR1 in the shell (installed within milliseconds, before any Python start-up),
    # then write the interrupted journal; bounded to 30 s.
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$FAKE_CHAOS_MODE" = hang ]; then\n'
        f"  trap 'FAKE_CHAOS_MODE=interrupted exec {fake} \"$@\"' USR1\n"
        "  i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n"
        "  exit 1\n"
        "fi\n"
        f'exec {fake} "$@"\n'
    )
    exe.chmod(0o755)
    monkeypatch.setenv("GPUFLEET_CHAOS_BIN", str(exe))
    monkeypatch.setenv("FAKE_CHAOS_ARGV", str(argv_log))
    # Should anything reach `gpufleet chaos revert`, it may only see a private, empty ledger.
    monkeypatch.setenv("GPUFLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    return argv_log
