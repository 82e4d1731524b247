"""`gpufleet gpu-reset` (ADR 0079): nvidia-smi resets the GPU, the reset is recorded in the kernel
log only when it succeeded, and node-health and `inspect --here` then count XIDs from the reset on.
nvidia-smi is a test double on PATH (no GPU on these machines) that logs how it was called."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.core.host import HostReadError
from gpufleet.health.cli import run as node_health
from gpufleet.health.gpu_reset import ResetOutcome, reset_and_mark

SMI = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
case "$1" in
  --query-gpu=*) printf '%s\\n' \\
    "0, 00000000:18:00.0, 0, 0, 35, 5, 16, 550.90.07, 96.00.89.00.01" \\
    "1, 00000000:2A:00.0, 0, 0, 36, 5, 16, 550.90.07, 96.00.89.00.01" ;;
  --query-remapped-rows=*) printf '%s\\n' "00000000:18:00.0, 0, 0, 0, 0" "00000000:2A:00.0, 0, 0, 0, 0" ;;
  --gpu-reset)
    [ "$3" = 0000:2a:00 ] && { echo "GPU 00000000:2A:00.0 is in use by another process." >&2; exit 255; }
    echo "GPU 00000000:18:00.0 was successfully reset." ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""
XID_48 = ("2026-12-05T09:00:00+00:00 gpu-a kernel: [ 5.0] NVRM: Xid (PCI:0000:18:00): 48, pid=1, "
          "name=python, DBE\n")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SMI)
    os.chmod(bin_dir / "nvidia-smi", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "kern.log").write_text(XID_48)
    return tmp_path


def calls(host: Path) -> list[str]:
    f = host / "bin" / "calls"
    return [c for c in f.read_text().splitlines() if c.startswith("--gpu-reset")] if f.exists() else []


def xid_findings(host: Path) -> list[str]:
    res = CliRunner().invoke(app, ["inspect", "--here", "--stack", "sandbox", "--node", "gpu-a",
                                   "--kernel-log", str(host / "kern.log"), "--no-record", "--format", "json",
                                   "--fabric-if", "lo"])
    return [f"{f['name']} {f['subject']}" for f in json.loads(res.output)["nodes"][0]["findings"]
            if f["name"].startswith("gpu-xid")]


def health(host: Path) -> int:
    return node_health(["--node", "gpu-a", "--kernel-log", str(host / "kern.log"), "--format", "json"],
                       out=io.StringIO())


def test_a_recorded_reset_ends_the_xid_for_both_readers(host: Path) -> None:
    assert xid_findings(host) == ["gpu-xid GPU 0"] and health(host) == 1
    kmsg = ["--kmsg", str(host / "kern.log")]
    res = CliRunner().invoke(app, ["gpu-reset", "0000:18:00.0", "0000:2a:00.0", *kmsg])
    assert res.exit_code == 1, res.output  # GPU 1 was busy: nvidia-smi refused its reset
    assert calls(host) == ["--gpu-reset -i 0000:18:00", "--gpu-reset -i 0000:2a:00"]
    marks = [ln for ln in (host / "kern.log").read_text().splitlines() if "GPU reset done" in ln]
    assert marks == ["<5>gpufleet: GPU reset done (PCI:0000:18:00)"]  # none for the GPU not reset
    assert "GPU 0000:2a:00: not reset, not recorded" in res.output
    assert xid_findings(host) == [] and health(host) == 0
    # an XID after the reset is the GPU's present state again
    with open(host / "kern.log", "a") as fh:
        fh.write(XID_48.replace("2026-12-05T09:00:00", "2099-01-01T00:00:00"))
    assert xid_findings(host) == ["gpu-xid GPU 0"] and health(host) == 1


def test_mark_only_records_a_reset_done_by_another_tool(host: Path) -> None:
    kmsg = ["--kmsg", str(host / "kern.log")]
    res = CliRunner().invoke(app, ["gpu-reset", "--mark-only", "00000000:18:00.0", *kmsg])
    assert res.exit_code == 0, res.output
    assert calls(host) == [] and xid_findings(host) == []


def test_bad_input_is_refused_before_any_reset(host: Path) -> None:
    res = CliRunner().invoke(app, ["gpu-reset", "18:00", "0000:18:00.0", "0000:18:00",
                                   "--kmsg", str(host / "no-dir" / "kmsg")])
    assert res.exit_code == 2
    assert "PCI[0]: not a PCI address: '18:00'" in res.output
    assert "PCI: a GPU is named twice" in res.output
    assert f"--kmsg: {host / 'no-dir' / 'kmsg'}: not writable here" in res.output
    assert calls(host) == []


def test_a_reset_whose_mark_cannot_be_written_says_so(tmp_path: Path) -> None:
    resets: list[str] = []
    gone = tmp_path / "gone" / "kmsg"
    got = reset_and_mark(["0000:18:00"], gone, mark_only=False, reset=resets.append)
    assert resets == ["0000:18:00"]
    assert got == [ResetOutcome("0000:18:00", True, f"{gone}: No such file or directory")]

    def refuse(pci: str) -> None:
        raise HostReadError(f"nvidia-smi exited 255: GPU {pci} is in use")

    got = reset_and_mark(["0000:2a:00"], tmp_path / "kmsg", mark_only=False, reset=refuse)
    assert got == [ResetOutcome("0000:2a:00", False, "nvidia-smi exited 255: GPU 0000:2a:00 is in use")]
    assert not (tmp_path / "kmsg").exists()
