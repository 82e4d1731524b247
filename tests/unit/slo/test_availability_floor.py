from __future__ import annotations

import pytest

from gpufleet.core import FaultClass
from gpufleet.slo import Intervals, availability, ettr, floor_seconds


def test_availability_clips_and_merges() -> None:
    spans = {"a": [(-10.0, 10.0), (5.0, 20.0), (90.0, None)], "b": [(50.0, 60.0)]}
    # a: [0,20] + [90,100] = 30 s; b: 10 s; 4 nodes x 100 s.
    assert availability(spans, (0.0, 100.0), 4) == 1.0 - 40.0 / 400.0


def test_availability_bounds() -> None:
    assert availability({}, (0.0, 1.0), 3) == 1.0
    assert availability({"a": [(0.0, None)]}, (0.0, 10.0), 1) == 0.0
    assert availability({"a": [(20.0, 30.0)]}, (0.0, 10.0), 1) == 1.0  # outside the window


@pytest.mark.parametrize(
    ("spans", "window", "total", "msg"),
    [
        ({}, (5.0, 5.0), 1, "not after its start"),
        ({}, (0.0, 1.0), 0, "at least 1"),
        ({"a": [(3.0, 1.0)]}, (0.0, 5.0), 1, "ends"),
        ({"a": [], "b": []}, (0.0, 5.0), 1, "only 1"),
    ],
)
def test_availability_rejects(spans: dict[str, list[tuple[float, float | None]]],
                              window: tuple[float, float], total: int, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        availability(spans, window, total)


def test_ettr() -> None:
    assert ettr(90.0, 100.0) == 0.9
    assert ettr(0.0, 5.0) == 0.0
    with pytest.raises(ValueError):
        ettr(101.0, 100.0)  # a ratio above 1 is a bug, not a result
    with pytest.raises(ValueError):
        ettr(1.0, 0.0)


SANDBOX = Intervals(
    scrape_seconds=2, evaluation_seconds=1, rule_for_seconds=0, health_check_seconds=5,
    slurmd_timeout_seconds=10, message_timeout_seconds=5, resubmit_delay_seconds=10,
    scheduler_interval_seconds=2, process_group_timeout_seconds=10, checkpoint_load_seconds=1,
)
RESTART = 10 + 1 + 0 + 1  # cred_expire + sched/2 + launch + load


def test_floor_gpu_fatal() -> None:
    f = floor_seconds(FaultClass.GPU_FATAL, SANDBOX)
    assert f.detect == 1.5  # scrape/2 + eval/2 + for 0
    assert f.isolate == 1.5
    assert f.recover == 1.5 + RESTART


def test_floor_gpu_contained_restarts_without_isolation() -> None:
    f = floor_seconds("gpu-contained", SANDBOX)
    assert (f.detect, f.isolate, f.recover) == (1.5, None, RESTART)


def test_floor_node_crash_uses_slurm_ping() -> None:
    f = floor_seconds(FaultClass.NODE_CRASH, Intervals(2, 1, None, 5, 10, 5, 10, 2, 10, 1))
    down = 10 + 3 / 2 + 5  # SlurmdTimeout + (SlurmdTimeout // 3) / 2 + MessageTimeout
    assert (f.detect, f.isolate, f.recover) == (down, down, down + RESTART)


def test_floor_link_down_waits_for_collective_timeout() -> None:
    f = floor_seconds(FaultClass.FABRIC_LINK_DOWN, SANDBOX)
    assert f.detect == 1.5
    assert f.isolate == 2.5  # health check / 2 beats Slurm's 16.5 s
    assert f.recover == 10 + RESTART


def test_floor_ride_through_classes_have_no_recovery() -> None:
    for fc in ("fabric-degraded", "storage-outage", "gpu-degraded"):
        assert floor_seconds(fc, SANDBOX).recover is None
    assert floor_seconds("fabric-degraded", SANDBOX).isolate is None


def test_floor_without_any_detection_path() -> None:
    iv = Intervals(2, 1, None, None)
    assert floor_seconds(FaultClass.GPU_FATAL, iv).detect is None


def test_floor_rejects_unknown_class() -> None:
    with pytest.raises(ValueError):
        floor_seconds("meteor-strike", SANDBOX)
