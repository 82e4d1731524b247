"""The host readers shared by node health and fleet inspection: nvidia-smi's CSV, sysfs ports, and
the tool runner's errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.core.host import HostReadError, run_tool
from gpufleet.core.host.links import LinkReading, read_ib_ports, read_net_links
from gpufleet.core.host.nvidia_smi import RemappedRows, parse_query_gpu, parse_remapped_rows

# Lines in the form `nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits` prints them.
QUERY_GPU = """\
0, 00000000:18:00.0, 0, 12, 41, 5, 16, 570.124.06, 96.00.9F.00.04
1, 00000000:2A:00.0, [N/A], [N/A], 39, 4, 8, 570.124.06, 96.00.9F.00.01
WARNING: infoROM is corrupted at gpu 0000:2A:00.0
"""


def test_query_gpu_rows_and_values_nvidia_smi_cannot_give() -> None:
    g0, g1 = parse_query_gpu(QUERY_GPU)
    assert (g0.index, g0.pci) == (0, "0000:18:00")
    assert (g0.ecc_uncorrected_volatile, g0.ecc_corrected_volatile) == (0.0, 12.0)
    assert (g0.pcie_gen, g0.pcie_width, g0.driver_version, g0.vbios_version) == (5, 16, "570.124.06",
                                                                                   "96.00.9F.00.04")
    # [N/A] is "could not read", never 0.
    assert g1.ecc_uncorrected_volatile is None and g1.ecc_corrected_volatile is None
    assert (g1.pci, g1.pcie_gen, g1.pcie_width) == ("0000:2a:00", 4, 8)


def test_remapped_rows() -> None:
    text = "00000000:18:00.0, 0, 2, 1, 0\n00000000:2A:00.0, [N/A], [N/A], [N/A], [N/A]\n"
    assert parse_remapped_rows(text) == [RemappedRows("0000:18:00", 0.0, 2.0, 1.0, 0.0),
                                         RemappedRows("0000:2a:00", None, None, None, None)]


def test_net_links_read_operstate_speed_and_carrier_changes(tmp_path: Path) -> None:
    for name, oper, speed, changes in (("ens1", "up", "400000", "6"), ("ens2", "down", None, "1")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "operstate").write_text(oper + "\n")
        (tmp_path / name / "carrier_changes").write_text(changes + "\n")
        if speed is not None:
            (tmp_path / name / "speed").write_text(speed + "\n")
    assert read_net_links(["ens1", "ens2", "ens3"], tmp_path) == [
        LinkReading("ens1", True, "up", 400.0, 6),
        LinkReading("ens2", False, "down", None, 1),  # `speed` of a down link does not read
        LinkReading("ens3", False, "absent"),
    ]


def _ib_port(root: Path, hca: str, state: str, rate: str, downed: int) -> None:
    port = root / hca / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "rate").write_text(rate + "\n")
    (port / "counters" / "link_downed").write_text(f"{downed}\n")


def test_ib_ports_all_or_the_named_hcas(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", "4: ACTIVE", "400 Gb/sec (4X NDR)", 0)
    _ib_port(tmp_path, "mlx5_1", "1: DOWN", "10 Gb/sec (4X SDR)", 3)
    everything = read_ib_ports(tmp_path)
    assert everything == [LinkReading("mlx5_0/1", True, "4: ACTIVE", 400.0, 0),
                          LinkReading("mlx5_1/1", False, "1: DOWN", 10.0, 6)]  # 3 downs = 6 changes
    named = read_ib_ports(tmp_path, ["mlx5_1", "mlx5_7"])
    assert named == [everything[1], LinkReading("mlx5_7/1", False, "absent")]


def test_run_tool_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostReadError, match="nvidia-smi not found"):
        run_tool(["nvidia-smi"])
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    os.chmod(tool, 0o755)
    with pytest.raises(HostReadError, match="exited 9: NVIDIA-SMI has failed"):
        run_tool(["nvidia-smi"])
    tool.write_text("#!/bin/sh\nexec /bin/sleep 5\n")
    with pytest.raises(HostReadError, match=r"no answer in 0\.2 s"):
        run_tool(["nvidia-smi"], timeout=0.2)
