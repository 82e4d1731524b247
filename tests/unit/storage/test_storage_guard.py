"""The OSD blast-radius guard (pure): never more OSDs down than the pools' spare copies."""

from __future__ import annotations

import pytest

from gpufleet.chaos.guard import osd_blast_radius


@pytest.mark.parametrize(
    ("down", "target", "size", "min_size", "allowed"),
    [
        (set(), 0, 2, 1, True),  # one of two copies may go
        ({0}, 1, 2, 1, False),  # a second OSD would leave some PG with no copy up
        ({0}, 0, 2, 1, True),  # the same OSD again (a hang after a kill) adds nothing
        ({0}, 1, 3, 1, True),
        ({0, 1}, 2, 3, 1, False),  # never every OSD
        (set(), 0, 3, 2, True),
        ({0}, 1, 3, 2, False),
        (set(), 0, 1, 1, False),  # a pool without replicas: no OSD may go
    ],
)
def test_osd_blast_radius(down: set[int], target: int, size: int, min_size: int, allowed: bool) -> None:
    reasons = osd_blast_radius(down, target, 3, size, min_size)
    assert (reasons == []) is allowed, reasons
    if not allowed:
        assert f"size {size} and min_size {min_size}" in reasons[0]


def test_an_osd_that_does_not_exist_is_named() -> None:
    assert osd_blast_radius(set(), 7, 3, 2, 1) == ["there is no osd.7: the cluster has osd.0 to osd.2"]
