"""The npu-smi reader: answers in the form npu-smi's source prints them on a 910B server (a tab, the
field padded to 30 or, for ECC, 40 characters, " : ", the value; gpufleet/core/host/npu_smi.py says
where), and a test double `npu-smi` on PATH for the commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.core.host import HostReadError, SmiGpu
from gpufleet.core.host.npu_smi import (
    NpuBoard,
    NpuEcc,
    npu_record,
    parse_board,
    parse_ecc,
    parse_ecc_enabled,
    parse_list,
    query_gpus,
)

# `npu-smi info -l` on a 910B server: no product name or serial number per NPU.
LIST = (
    "\tTotal Count                    : 2\n"
    "\n"
    "\tNPU ID                         : 0\n"
    "\tChip Count                     : 1\n"
    "\n"
    "\tNPU ID                         : 1\n"
    "\tChip Count                     : 1\n"
    "\n"
)

# `npu-smi info -t board -i 0` on a 910B server (print_ascend_board_info).
BOARD_0 = (
    "\tNPU ID                         : 0\n"
    "\tProduct Name                   : NA\n"
    "\tModel                          : NA\n"
    "\tManufacturer                   : Huawei\n"
    "\tSerial Number                  : 102312345678\n"
    "\tSoftware Version               : 24.1.rc2\n"
    "\tFirmware Version               : 7.5.0.1.129\n"
    "\tCompatibility                  : OK\n"
    "\tBoard ID                       : 0x33\n"
    "\tPCB ID                         : A\n"
    "\tBOM ID                         : 1\n"
    "\tPCIe Bus Info                  : 0000:C1:00.0\n"
    "\tSlot ID                        : 0\n"
    "\tClass ID                       : NA\n"
    "\tPCI Vendor ID                  : 0x19E5\n"
    "\tPCI Device ID                  : 0xD802\n"
    "\tSubsystem Vendor ID            : 0x19E5\n"
    "\tSubsystem Device ID            : 0x3005\n"
    "\tChip Count                     : 1\n"
)

# `npu-smi info -t ecc -i 0` on a 910B: no DDR lines, the 8 HBM lines, "Chip ID" after the chip's.
HBM_LINES = (
    "\tHBM Single Bit Error Count               : 7\n"
    "\tHBM Double Bit Error Count               : 1\n"
    "\tHBM Single Bit Aggregate Total Err Cnt   : 130\n"
    "\tHBM Double Bit Aggregate Total Err Cnt   : 4\n"
    "\tHBM Single Bit Isolated Pages Count      : 0\n"
    "\tHBM Double Bit Isolated Pages Count      : 3\n"
    "\tHBM Single Bit Next-Isolated Pages Count : 0\n"
    "\tHBM Double Bit Next-Isolated Pages Count : 1\n"
)
ECC_0 = (
    "\tNPU ID                                   : 0\n"
    "\tChip Count                               : 1\n"
    "\n"
    + HBM_LINES +
    "\tChip ID                                  : 0\n"
    "\n"
)

ECC_ON = "\tHBM ECC-Enable Status          : True\n"
ECC_OFF = "\tHBM ECC-Enable Status          : False\n"


def test_the_list_gives_the_npu_ids() -> None:
    assert parse_list(LIST) == [0, 1]
    assert parse_list("There is no NPU card on this server.\n") == []


def test_board_gives_address_driver_and_firmware() -> None:
    # The address keeps its colons (split at the field's colon only) and is normalized as XID lines carry it.
    assert parse_board(BOARD_0) == NpuBoard(pci="0000:c1:00", driver_version="24.1.rc2",
                                            firmware_version="7.5.0.1.129")
    # "NA" is "could not read" (a non-root user reads no firmware version; a UB board has no PCIe).
    na = BOARD_0.replace("7.5.0.1.129", "NA").replace("0000:C1:00.0", "NA")
    assert parse_board(na) == NpuBoard(pci=None, driver_version="24.1.rc2", firmware_version=None)


def test_ecc_reads_the_current_hbm_counts_only() -> None:
    # Current single-bit = correctable, double-bit = uncorrectable; lifetime totals and pages are not read.
    assert parse_ecc(ECC_0) == NpuEcc(uncorrectable=1.0, correctable=7.0)
    # The 910 form: DDR lines first (not read), then the HBM ones.
    ddr = ECC_0.replace("\tHBM Single Bit Error Count", "\tDDR Single Bit Error Count               : 99\n"
                                                         "\tHBM Single Bit Error Count")
    assert parse_ecc(ddr) == NpuEcc(uncorrectable=1.0, correctable=7.0)
    # Several chips under one NPU ID: summed.
    two = ("\tNPU ID                                   : 0\n"
           "\tChip Count                               : 2\n\n"
           + HBM_LINES + "\tChip ID                                  : 0\n\n"
           + HBM_LINES + "\tChip ID                                  : 1\n\n")
    assert parse_ecc(two) == NpuEcc(uncorrectable=2.0, correctable=14.0)
    # No HBM line (a chip without HBM, or an error message): unknown, never 0.
    assert parse_ecc("This device does not support querying ecc.\n") == NpuEcc(None, None)


def test_ecc_enable_status() -> None:
    assert [parse_ecc_enabled(t) for t in (ECC_ON, ECC_OFF, "")] == [True, False, None]


def test_counts_are_taken_only_with_ecc_on_and_an_npu_needs_an_address() -> None:
    board, ecc = parse_board(BOARD_0), parse_ecc(ECC_0)
    assert npu_record(0, board, ecc, True) == SmiGpu(
        index=0, pci="0000:c1:00", ecc_uncorrected_volatile=1.0, ecc_corrected_volatile=7.0,
        temperature_c=None, pcie_gen=None, pcie_width=None, driver_version="24.1.rc2",
        vbios_version="7.5.0.1.129")
    # ECC off, or its status not said: the counts print as numbers, but are unknown.
    for enabled in (False, None):
        rec = npu_record(0, board, ecc, enabled)
        assert rec is not None and (rec.ecc_uncorrected_volatile, rec.ecc_corrected_volatile) == (None, None)
    assert npu_record(0, NpuBoard(None, "24.1.rc2", None), ecc, True) is None


DOUBLE = """#!/bin/sh
# npu-smi's answers to the queries gpufleet reads (a test double; answers in files beside it).
here=$(dirname "$0")
case "$*" in
  "info -l") cat "$here/list.txt" ;;
  "info -t board -i "*) cat "$here/board-${5}.txt" ;;
  "info -t ecc -i "*) cat "$here/ecc-${5}.txt" ;;
  "info -t ecc-enable -i "*) cat "$here/ecc-enable-${5}.txt" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def npu_smi_double(bin_dir: Path, answers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`npu-smi` on PATH answering from `answers` (file name -> text: list.txt, board-N.txt, ...)."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "npu-smi").write_text(DOUBLE)
    os.chmod(bin_dir / "npu-smi", 0o755)
    for name, text in answers.items():
        (bin_dir / name).write_text(text)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def two_npus() -> dict[str, str]:
    board_1 = BOARD_0.replace("NPU ID                         : 0", "NPU ID                         : 1") \
                     .replace("0000:C1:00.0", "0000:01:00.0")
    ecc_1 = ECC_0.replace("NPU ID                                   : 0", "NPU ID                         "
                          "          : 1")
    return {"list.txt": LIST, "board-0.txt": BOARD_0, "board-1.txt": board_1, "ecc-0.txt": ECC_0,
            "ecc-1.txt": ecc_1, "ecc-enable-0.txt": ECC_ON, "ecc-enable-1.txt": ECC_OFF}


def test_query_gpus_runs_npu_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    npu_smi_double(tmp_path / "bin", two_npus(), monkeypatch)
    n0, n1 = query_gpus()
    assert (n0.index, n0.pci, n0.ecc_uncorrected_volatile, n0.ecc_corrected_volatile, n0.pcie_gen,
            n0.pcie_width, n0.driver_version, n0.vbios_version) == (0, "0000:c1:00", 1.0, 7.0, None, None,
                                                                    "24.1.rc2", "7.5.0.1.129")
    # NPU 1 has HBM ECC off: its counts read 0 but are unknown.
    assert (n1.index, n1.pci, n1.ecc_uncorrected_volatile, n1.ecc_corrected_volatile) == (1, "0000:01:00",
                                                                                           None, None)


def test_query_gpus_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = two_npus()
    answers["list.txt"] = "There is no NPU card on this server.\n"
    npu_smi_double(tmp_path / "bin", answers, monkeypatch)
    with pytest.raises(HostReadError, match=r"npu-smi listed no NPU: 'There is no NPU card on this"):
        query_gpus()
    npu_smi_double(tmp_path / "bin", two_npus(), monkeypatch)
    (tmp_path / "bin" / "ecc-1.txt").unlink()  # `cat` fails: npu-smi exits non-zero
    with pytest.raises(HostReadError, match="npu-smi exited 1"):
        query_gpus()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HostReadError, match="npu-smi not found"):
        query_gpus()
