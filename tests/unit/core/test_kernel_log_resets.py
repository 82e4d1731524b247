"""The kernel log's GPU resets (ADR 0079): XIDs before a GPU's recorded reset, or before a boot line,
are history; the reset mark `gpufleet gpu-reset` writes is what dates the reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.core.host.kernel_log import parse_kernel_log, reset_mark, write_reset_mark

PCI = ["0000:18:00", "0000:2a:00", "0000:5d:00"]
GPU = {p: i for i, p in enumerate(PCI)}


def xid(at: str, pci: str, code: int) -> str:
    return f"{at} h kernel: [  5.000000] NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python, text"


def test_a_reset_mark_ends_its_gpus_xids_only() -> None:
    lines = [
        xid("2026-12-06T10:00:00.000000+00:00", PCI[0], 48),
        xid("2026-12-06T10:00:01.000000+00:00", PCI[1], 79),
        "2026-12-06T10:05:00.000000+00:00 h gpufleet: GPU reset done (PCI:0000:18:00)",
        xid("2026-12-06T10:06:00.000000+00:00", PCI[0], 94),
    ]
    log = parse_kernel_log(lines, GPU, default_at=0.0)
    assert [(x.gpu, x.xid) for x in log.xids] == [(0, 48), (1, 79), (0, 94)]
    assert [(x.gpu, x.xid) for x in log.current] == [(1, 79), (0, 94)]
    assert log.reset_at(PCI[0]) == 1796551500.0  # 2026-12-06T10:05:00Z
    assert log.reset_at(PCI[1]) is None and log.reset_at(None) is None


def test_a_boot_line_resets_every_gpu_and_older_marks() -> None:
    lines = [
        "2026-12-06T09:00:00.000000+00:00 h gpufleet: GPU reset done (PCI:0000:2a:00)",
        xid("2026-12-06T09:30:00.000000+00:00", PCI[2], 79),
        "2026-12-06T10:00:00.000000+00:00 h kernel: [    0.000000] Linux version 6.1.0-27-amd64 (x) #1 SMP",
        xid("2026-12-06T10:01:00.000000+00:00", PCI[1], 13),
    ]
    log = parse_kernel_log(lines, GPU, default_at=0.0)
    assert [(x.gpu, x.xid) for x in log.current] == [(1, 13)]
    assert log.boot_at == 1796551200.0 and log.resets == {}
    assert log.reset_at(PCI[1]) == log.reset_at(PCI[2]) == 1796551200.0
    # `dmesg --time-format iso` prints the boot line without a tag
    dmesg = ["2026-12-06T10:00:00,000000+00:00 Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org)"]
    assert parse_kernel_log(dmesg, GPU, 0.0).boot_at == 1796551200.0
    # words in another message are no boot
    assert parse_kernel_log(["h app: see Linux version 6.1 notes"], GPU, 0.0).boot_at is None


def test_the_mark_written_is_the_mark_read(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(xid("2026-12-06T10:00:00.000000+00:00", PCI[2], 79) + "\n")
    assert write_reset_mark("00000000:5D:00.0", kmsg) == "gpufleet: GPU reset done (PCI:0000:5d:00)"
    # the /dev/kmsg priority prefix <5> stays in a plain file; the reader finds the mark after it
    assert kmsg.read_text().splitlines()[-1] == "<5>gpufleet: GPU reset done (PCI:0000:5d:00)"
    log = parse_kernel_log(kmsg.read_text().splitlines(), GPU, default_at=42.0)
    assert log.current == () and log.reset_at(PCI[2]) == 42.0  # undated line: dated now
    with pytest.raises(ValueError, match="not a PCI address"):
        reset_mark("5d")


def test_a_missing_log_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_reset_mark(PCI[0], tmp_path / "no" / "kmsg")


Event = tuple[str, int]  # ("xid", gpu) | ("reset", gpu) | ("boot", 0)


@given(st.lists(st.tuples(st.sampled_from(["xid", "xid", "reset", "boot"]), st.integers(0, 2)), max_size=30))
def test_current_is_what_no_later_reset_or_boot_covers(events: list[Event]) -> None:
    lines, want = [], []
    for i, (kind, gpu) in enumerate(events):
        at = f"2026-12-06T10:{i // 60:02d}:{i % 60:02d}.000000+00:00"
        if kind == "xid":
            lines.append(xid(at, PCI[gpu], 40 + i))
            want.append((gpu, 40 + i))
        elif kind == "reset":
            lines.append(f"{at} h {reset_mark(PCI[gpu])}")
            want = [w for w in want if w[0] != gpu]
        else:
            lines.append(f"{at} h kernel: [    0.000000] Linux version 6.1.0 (b) #1")
            want = []
    log = parse_kernel_log(lines, GPU, default_at=0.0)
    assert [(x.gpu, x.xid) for x in log.current] == want
    assert len(log.xids) == sum(k == "xid" for k, _ in events)
