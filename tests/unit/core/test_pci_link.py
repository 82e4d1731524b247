"""A device's PCIe link from sysfs (core.host.pci_link) on a synthetic tree: these machines' virtual
devices are not PCI Express and have no link attributes (checked: none of /sys/bus/pci/devices/*
has current_link_width)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.host.pci_link import PciLink, gen_of, read_pci_link, width_of


@pytest.mark.parametrize(("speed", "gen"), [
    ("2.5 GT/s", 1), ("5 GT/s", 2), ("8 GT/s\n", 3), ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe\n", 5),
    ("64.0 GT/s PCIe", 6), ("Unknown", None), ("", None), ("12 GT/s", None),
])
def test_the_generation_is_read_from_the_rate(speed: str, gen: int | None) -> None:
    assert gen_of(speed) == gen


@pytest.mark.parametrize(("text", "width"),
                         [("16\n", 16), ("8", 8), ("0\n", None), ("x16", None), ("", None)])
def test_the_width_is_a_lane_count(text: str, width: int | None) -> None:
    assert width_of(text) == width


def test_a_device_s_link_and_what_is_not_there(tmp_path: Path) -> None:
    dev = tmp_path / "0000:c1:00.0"
    dev.mkdir()
    for name, value in (("current_link_width", "8"), ("max_link_width", "16"),
                        ("current_link_speed", "2.5 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe")):
        (dev / name).write_text(value + "\n")
    assert read_pci_link("0000:c1:00", tmp_path) == PciLink(width=8, max_width=16, max_gen=5)
    assert read_pci_link("0000:c2:00", tmp_path) is None  # no such device
    (tmp_path / "0000:00:01.0").mkdir()  # a device that is not PCI Express: no link files
    assert read_pci_link("0000:00:01", tmp_path) is None
