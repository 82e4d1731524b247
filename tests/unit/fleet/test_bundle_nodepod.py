"""The node pod's collection (gpufleet.fleet.bundle.nodepod, ADR 0085): its archive carried through
a log and checked on the way back, bad input refused, and a real run of the real-node table here."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from gpufleet.fleet.bundle.nodepod import BEGIN, END, decode, encode, main


def test_the_archive_survives_the_log_whatever_is_printed_around_it() -> None:
    data = bytes(range(256)) * 1000
    text = encode("bundle-gpu-3-x.tar.gz", data)
    assert all(len(line) <= 76 for line in text.splitlines()[1:-1])
    log = "collecting...\n" + encode("bundle-gpu-3-old.tar.gz", b"old") + text + "done\n"
    assert decode(log) == ("bundle-gpu-3-x.tar.gz", data)  # the last archive in the log


@pytest.mark.parametrize(("log", "why"), [
    ("nothing here\n", f"no {BEGIN} line"),
    (encode("b.tar.gz", b"x" * 1000).rsplit(END, 1)[0], "the log was cut short"),
    (encode("b.tar.gz", b"abc").replace("YWJj", "YWJk"), "its header says 3 bytes"),
    (encode("b.tar.gz", b"abc").replace("YWJj", "!!!!"), "not base64"),
    (encode("../b.tar.gz", b"abc"), "not a bundle's file name"),
    (f"{BEGIN} b.tar.gz many abc\n{END}\n", "bad header line"),
])
def test_a_damaged_archive_is_refused_saying_why(log: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode(log)


def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_NODE", raising=False)
    assert main(["--devices", "0,x"]) == 2
    err = capsys.readouterr().err
    assert "$GPUFLEET_NODE is unset" in err and "--devices '0,x'" in err
    assert main(["--node", "gpu-3", "--vendor", "intel"]) == 2
    assert "vendor 'intel' is not one of" in capsys.readouterr().err


def test_a_run_here_prints_the_nodes_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "termination-log"
    assert main(["--node", "gpu-3", "--vendor", "amd", "--fabric", "efa", "--deadline", "20",
                 "--termination-log", str(log)]) == 0
    name, data = decode(capsys.readouterr().out)
    summary = json.loads(log.read_text())
    assert summary["bundle"] == name and summary["bytes"] == len(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        f = tar.extractfile("manifest.json")
        assert f is not None
        manifest = json.load(f)
    assert (manifest["node"], manifest["source"], manifest["trigger"]) == ("gpu-3", "amd", "node-pod")
    # amd-smi is not on this machine: the member says so, and the summary lists it.
    smi = next(m for m in manifest["members"] if m["collector"] == "amd-smi-static")
    assert smi["status"] == "failed" and "amd-smi-static=failed" in summary["notOk"]
