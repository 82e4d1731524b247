"""Every input file the CLI reads that is not UTF-8, binary, a directory, missing, empty or huge gives
exit 2 and a message naming the file, never a traceback; output paths are checked before any work;
numeric options are bounded; `validate` checks the experiments a stack's game-day names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gpufleet.cli.main import app

ROOT = Path(__file__).parents[3]
STACKS = ROOT / "stacks"
runner = CliRunner()

BAD_FILES = {
    "binary": (b"config:\n\x00\x00\x7fELF", "is a binary file (NUL byte at offset 8)"),
    "latin-1": ("config:\n  gpufleet:cluster: {name: café}\n".encode("latin-1"), "is not UTF-8 text"),
    "empty": (b"", "is empty"),
}


def run(args: list[str]) -> Result:
    result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def refused(result: Result, file: Path | str, message: str) -> None:
    assert result.exit_code == 2, result.output
    err = " ".join(result.stderr.split())
    assert f"invalid input {file}" in err, err
    assert f"{file}: (file): {message}" in err, err


@pytest.fixture
def bad(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str]:
    content, message = BAD_FILES[request.param]
    path = tmp_path / "input.yaml"
    path.write_bytes(content)
    return path, message


@pytest.mark.parametrize("bad", list(BAD_FILES), indirect=True)
def test_stack_file(bad: tuple[Path, str]) -> None:
    path, message = bad
    refused(run(["validate", str(path)]), path, message)
    refused(run(["simulate", "--stack", str(path)]), path, message)


@pytest.mark.parametrize("bad", list(BAD_FILES), indirect=True)
def test_catalog_extension(bad: tuple[Path, str]) -> None:
    path, message = bad
    refused(run(["catalog", "check", str(path)]), path, message)
    refused(run(["catalog", "list", "--data-dir", str(path.parent)]), path, message)


@pytest.mark.parametrize("bad", list(BAD_FILES), indirect=True)
def test_scenario_and_report(bad: tuple[Path, str], tmp_path: Path) -> None:
    path, message = bad
    base = ["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--out", str(tmp_path / "o")]
    refused(run([*base, "--scenario", str(path)]), path, message)
    report = path.with_suffix(".json")
    path.rename(report)
    refused(run([*base, "--from-report", str(report)]), report, message)
    assert not (tmp_path / "o").exists()  # nothing ran


def test_a_directory_a_missing_file_and_a_huge_one(tmp_path: Path) -> None:
    refused(run(["validate", str(tmp_path)]), tmp_path, "is a directory, not a file")
    refused(run(["validate", str(tmp_path / "nope.yaml")]), tmp_path / "nope.yaml", "does not exist")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate(64 * 1024 * 1024)
    refused(run(["validate", str(huge)]), huge, "is 64.0 MiB, larger than the 16.0 MiB")
    folder = tmp_path / "scenario.yaml"
    folder.mkdir()
    result = run(["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--scenario", str(folder)])
    refused(result, folder, "is a directory, not a file")


def test_output_paths_are_checked_before_the_work(tmp_path: Path) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    result = run(["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--out", str(a_file)])
    assert result.exit_code == 2 and f"{a_file}: --out: exists and is not a directory" in result.stderr
    result = run(["gameday", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--backend", "slurm",
                  "--report", str(a_file / "r")])
    assert result.exit_code == 2
    assert f"--report: cannot create it: {a_file} is not a directory" in " ".join(result.stderr.split())
    result = run(["preview", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--json", str(tmp_path)])
    assert result.exit_code == 2 and "--json: is a directory; give a file name" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--days", "1000000000"], "--days"),
        (["--days", "0"], "--days"),
        (["--runs", "0"], "--runs"),
        (["--runs", "1000001"], "--runs"),
        (["--workers", "100000"], "--workers"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_simulate_numeric_bounds(args: list[str], words: str, tmp_path: Path) -> None:
    result = run(["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--out", str(tmp_path / "o"),
                  *args])
    assert result.exit_code == 2 and words in result.output
    assert not (tmp_path / "o").exists()


def test_simulate_cost_is_bounded_whatever_sets_the_horizon(tmp_path: Path) -> None:
    result = run(["simulate", "--stack", "scale-10k", "--stacks-dir", str(STACKS), "--runs", "100000",
                  "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "runs x days x GPUs: 100,000 runs x 54 days x 10,000 GPUs" in err
    assert "lower --runs or --days" in err
    scenario = tmp_path / "long.yaml"
    scenario.write_text("days: 100000\n")
    result = run(["simulate", "--stack", "sandbox", "--stacks-dir", str(STACKS), "--scenario", str(scenario),
                  "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"{scenario}: days: 100000 days is more than the 3650 allowed" in " ".join(result.stderr.split())
    assert not (tmp_path / "o").exists()


def test_validate_checks_the_gamedays_experiments_exist(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.h200-ib.yaml"
    text = (STACKS / "Pulumi.h200-ib.yaml").read_text()
    listed = "experiments: [k8s-gpu-xid79-quarantine-drain, k8s-node-crash, k8s-fabric-port-down]"
    assert listed in text
    stack.write_text(text.replace(listed, "experiments: [k8s-gpu-xid79-quarantine-drain, k8s-node-crashed]"))
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    for name in ("k8s-gpu-xid79-quarantine-drain", "k8s-node-crash"):
        shutil.copy(ROOT / "experiments" / f"{name}.json", experiments)
    result = run(["validate", str(stack), "--experiments-dir", str(experiments)])
    assert result.exit_code == 2
    assert (f"{stack}: gameday.experiments[1]: no experiment file {experiments / 'k8s-node-crashed.json'}; "
            "known: k8s-gpu-xid79-quarantine-drain, k8s-node-crash") in " ".join(result.stderr.split())
    shipped = STACKS / "Pulumi.h200-ib.yaml"
    ok = run(["validate", str(shipped), "--experiments-dir", str(ROOT / "experiments")])
    assert ok.exit_code == 0, ok.output


def test_validate_refuses_experiments_the_stacks_backend_cannot_run(tmp_path: Path) -> None:
    """An experiment written for another backend (its tags), or injecting a fault the game-day's
    backend cannot inject, is refused with what to name instead."""
    stack = tmp_path / "Pulumi.h200-ib.yaml"
    text = (STACKS / "Pulumi.h200-ib.yaml").read_text()
    listed = "experiments: [k8s-gpu-xid79-quarantine-drain, k8s-node-crash, k8s-fabric-port-down]"
    stack.write_text(text.replace(listed, "experiments: [node-crash, node-hang]"))
    result = run(["validate", str(stack), "--experiments-dir", str(ROOT / "experiments")])
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert ("gameday.experiments[0]: node-crash is written for sandbox (its tags), the stack's game-day "
            "runs on kubernetes: name one tagged kubernetes: k8s-fabric-port-down, "
            "k8s-gpu-xid79-quarantine-drain, k8s-node-crash") in err
    assert ("gameday.experiments[1]: node-hang injects node-hang: backend kubernetes cannot inject "
            "node-hang: needs out-of-band power control") in err
