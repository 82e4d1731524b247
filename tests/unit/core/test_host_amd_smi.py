"""The amd-smi reader: JSON documents in the shapes amd-smi prints them (field names from its source,
gpufleet/core/host/amd_smi.py says where), and a test double `amd-smi` on PATH for the command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.core.host import HostReadError, SmiGpu
from gpufleet.core.host.amd_smi import AmdMetric, parse_metric, parse_static, query_gpus, with_metric

# `amd-smi static --bus --vbios --driver --json`, ROCm 6.2 CLI: a list of per-GPU objects, the speed
# with its unit, "N/A" for what the library could not read (here all of GPU 1's link and firmware).
STATIC_62 = """[
    {"gpu": 0,
     "bus": {"bdf": "0000:0c:00.0", "max_pcie_width": 16, "max_pcie_speed": {"value": 32, "unit": "GT/s"},
             "pcie_interface_version": "Gen 5", "slot_type": "OAM"},
     "vbios": {"name": "AMD MI300X", "build_date": "2024/05/10 10:00", "part_number": "113-M3000100-102",
               "version": "022.040.003.043.000001"},
     "driver": {"name": "amdgpu", "version": "6.7.0"}},
    {"gpu": 1,
     "bus": {"bdf": "0000:22:00.0", "max_pcie_width": "N/A", "max_pcie_speed": "N/A",
             "pcie_interface_version": "N/A", "slot_type": "N/A"},
     "vbios": "N/A",
     "driver": {"name": "amdgpu", "version": "6.7.0"}}
]"""

# The newer CLI (ROCm 7.x): the list under "gpu_data", the firmware section named "ifwi".
STATIC_7 = """{"gpu_data": [
    {"gpu": 0,
     "bus": {"bdf": "0000:9F:00.0", "max_pcie_width": 8, "max_pcie_speed": {"value": 16, "unit": "GT/s"},
             "pcie_levels": "N/A", "pcie_interface_version": "N/A", "slot_type": "OAM"},
     "ifwi": {"name": "AMD MI300X", "build_date": "2025/01/20 09:00", "part_number": "113-M3000100-103",
              "version": "022.041.000.012.000001", "boot_firmware": "N/A"},
     "driver": {"name": "amdgpu", "version": "6.12.12", "os_kernel_version": "6.8.0-60-generic"}}
]}"""

# `amd-smi metric --ecc --pcie --json`: totals as plain integers, the current link width, "N/A" when
# the library could not read them (GPU 0's link trained to x8 although the GPU can do x16).
ECC_62 = """[
    {"gpu": 0, "ecc": {"total_correctable_count": 12, "total_uncorrectable_count": 0,
                       "total_deferred_count": 0, "cache_correctable_count": 0,
                       "cache_uncorrectable_count": 0},
     "pcie": {"width": 8, "speed": {"value": 32, "unit": "GT/s"}, "bandwidth": {"value": 0, "unit": "Mb/s"},
              "replay_count": 0, "l0_to_recovery_count": 0, "replay_roll_over_count": 0,
              "nak_sent_count": 0, "nak_received_count": 0}},
    {"gpu": 1, "ecc": {"total_correctable_count": "N/A", "total_uncorrectable_count": "N/A",
                       "cache_correctable_count": "N/A", "cache_uncorrectable_count": "N/A"},
     "pcie": {"width": "N/A", "speed": "N/A"}}
]"""


def test_static_rocm_6_2_shape() -> None:
    g0, g1 = parse_static(STATIC_62)
    assert g0 == SmiGpu(index=0, pci="0000:0c:00", ecc_uncorrected_volatile=None, ecc_corrected_volatile=None,
                        temperature_c=None, pcie_gen=5, pcie_width=None, driver_version="6.7.0",
                        vbios_version="022.040.003.043.000001")
    # "N/A" is "could not read", never 0.
    assert (g1.index, g1.pci, g1.pcie_gen, g1.pcie_width, g1.vbios_version) == (1, "0000:22:00", None, None,
                                                                                 None)


def test_static_newer_shape_and_generation_from_the_speed() -> None:
    (g,) = parse_static(STATIC_7)
    # No "Gen N" given: 16 GT/s is Gen 4. The firmware is read from "ifwi".
    assert (g.pci, g.pcie_gen) == ("0000:9f:00", 4)
    assert (g.driver_version, g.vbios_version) == ("6.12.12", "022.041.000.012.000001")


def test_a_gpu_without_an_address_is_not_listed() -> None:
    doc = json.loads(STATIC_62)
    doc[1]["bus"]["bdf"] = "N/A"
    assert [g.index for g in parse_static(json.dumps(doc))] == [0]


def test_ecc_totals_link_width_and_what_amd_smi_cannot_give() -> None:
    assert parse_metric(ECC_62) == {0: AmdMetric(0.0, 12.0, 8), 1: AmdMetric(None, None, None)}
    wrapped = json.dumps({"gpu_data": json.loads(ECC_62)})
    assert parse_metric(wrapped) == parse_metric(ECC_62)
    merged = with_metric(parse_static(STATIC_62), {0: AmdMetric(1.0, 12.0, 16)})
    assert [(g.ecc_uncorrected_volatile, g.ecc_corrected_volatile, g.pcie_width) for g in merged] == [
        (1.0, 12.0, 16), (None, None, None)]


@pytest.mark.parametrize(("text", "says"), [
    ("amd-smi: ERROR: no devices", "amd-smi static: not JSON: 'amd-smi: ERROR: no devices'"),
    ('{"cpu_data": []}', "amd-smi static: no list of GPUs"),
])
def test_an_answer_that_is_not_a_gpu_list_is_a_read_error(text: str, says: str) -> None:
    with pytest.raises(HostReadError, match=says):
        parse_static(text)


DOUBLE = """#!/bin/sh
# amd-smi's answers to the two queries gpufleet reads (a test double; documents beside it).
here=$(dirname "$0")
case "$*" in
  "static --bus --vbios --driver --json") cat "$here/static.json" ;;
  "metric --ecc --pcie --json") cat "$here/ecc.json" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def amd_smi_double(bin_dir: Path, static: str, ecc: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "amd-smi").write_text(DOUBLE)
    os.chmod(bin_dir / "amd-smi", 0o755)
    (bin_dir / "static.json").write_text(static)
    (bin_dir / "ecc.json").write_text(ecc)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_query_gpus_runs_amd_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amd_smi_double(tmp_path / "bin", STATIC_62, ECC_62, monkeypatch)
    g0, g1 = query_gpus()
    assert (g0.index, g0.pci, g0.ecc_uncorrected_volatile, g0.ecc_corrected_volatile, g0.pcie_gen,
            g0.pcie_width) == (0, "0000:0c:00", 0.0, 12.0, 5, 8)
    assert (g1.ecc_uncorrected_volatile, g1.ecc_corrected_volatile) == (None, None)


def test_query_gpus_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amd_smi_double(tmp_path / "bin", "[]", ECC_62, monkeypatch)
    with pytest.raises(HostReadError, match=r"amd-smi listed no GPU: '\[\]'"):
        query_gpus()
    amd_smi_double(tmp_path / "bin", STATIC_62, ECC_62, monkeypatch)
    (tmp_path / "bin" / "ecc.json").unlink()  # `cat` fails: amd-smi exits non-zero
    with pytest.raises(HostReadError, match="amd-smi exited 1"):
        query_gpus()
