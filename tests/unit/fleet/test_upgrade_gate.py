"""The upgrade gate's verdict from inspect's checks (no I/O): the inspect level, the performance
floor against the pool's reference, the expected version, and never a pass on what was not read."""

from __future__ import annotations

from typing import Any

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.fleet.inspect.checks import Pins, Reference
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs
from gpufleet.fleet.inspect.thresholds import load_thresholds
from gpufleet.fleet.upgrade.gate import GateSetup, expected_pins, inspect_gate, perf_gate
from gpufleet.fleet.upgrade.model import Component

CAT = load_catalog()
RULES, _ = xid_policy(CAT, {})
OLD, NEW = "550.90.07", "570.124.06"
FW = "96.00.89.00.01"
REF = {"sandbox": {"fabric_tcp_mbps": Reference(400.0, "median of pool sandbox (3 nodes)")}}


def setup(level: str = "full", floor: float = 90.0, **kw: Any) -> GateSetup:
    return GateSetup(level=level, floor_percent=floor, thresholds=load_thresholds(),  # type: ignore[arg-type]
                     xid_rules=RULES, component=Component.DRIVER,
                     pins={"sandbox": Pins(driver=OLD, firmware=FW)}, references=kw.get("refs", REF),
                     fault_actions={f.id: f.action for f in CAT})


def obs(**kw: Any) -> NodeObservation:
    base: dict[str, Any] = dict(
        node="gpu-2", pool="sandbox", sku=AcceleratorModel.H100_SXM, at=1.0, expected_gpus=4,
        sched_state="drained", gpus=tuple(GpuObs(index=i) for i in range(4)),
        ports=(PortObs(name="fab0", state="up", speed_gbps=100.0),), expected_port_gbps=100.0,
        driver_version=NEW, firmware_version=FW, perf={"fabric_tcp_mbps": 396.0},
    )
    base.update(kw)
    return NodeObservation(**base)


def test_a_healthy_upgraded_node_passes_with_its_performance_in_the_detail() -> None:
    v = inspect_gate(obs(), setup(), NEW)
    assert v.passed, v.detail
    assert "fabric_tcp_mbps 99%" in v.detail and "floor 90%" in v.detail
    # The stack pins the old driver; the gate expects the version it installed, not drift.
    assert expected_pins(Pins(OLD, FW), Component.DRIVER, NEW) == Pins(NEW, FW)
    assert expected_pins(Pins(OLD, FW), Component.FIRMWARE, "97.0") == Pins(OLD, "97.0")


def test_below_the_performance_floor_fails_and_the_floor_is_the_stacks() -> None:
    slow = obs(perf={"fabric_tcp_mbps": 340.0})  # 85 % of the pool's 400
    v = inspect_gate(slow, setup(), NEW)
    assert not v.passed and "GFI052" in v.detail and "85.0%" in v.detail
    assert inspect_gate(slow, setup(floor=80.0), NEW).passed


def test_a_light_gate_runs_no_performance_check() -> None:
    v = inspect_gate(obs(perf={"fabric_tcp_mbps": 10.0}), setup(level="light"), NEW)
    assert v.passed and not v.result.full and "performance" not in v.detail


def test_a_gpu_fault_or_the_wrong_version_fails_the_gate() -> None:
    faulty = obs(gpus=tuple(GpuObs(index=i, xids=(79,) if i == 3 else ()) for i in range(4)))
    v = inspect_gate(faulty, setup(), NEW)
    assert not v.passed and "GFI002" in v.detail and "XID 79" in v.detail
    v = inspect_gate(obs(driver_version=OLD), setup(), NEW)
    assert not v.passed and "driver-drift" in v.detail
    # After a rollback the gate expects the old version.
    assert inspect_gate(obs(driver_version=OLD), setup(), OLD).passed


def test_what_could_not_be_read_never_passes() -> None:
    v = inspect_gate(obs(gpus=None, unknown=("gpus: agent unreachable",)), setup(), NEW)
    assert not v.passed and v.result.status == "unknown" and "agent unreachable" in v.detail
    v = inspect_gate(obs(perf={}, unknown=("perf: the bandwidth probe measured nothing",)), setup(), NEW)
    assert not v.passed and "probe" in v.detail


def test_without_a_pool_reference_performance_is_not_compared_and_says_so() -> None:
    v = inspect_gate(obs(), setup(refs={}), NEW)
    assert v.passed and "performance not compared" in v.detail and "no reference" in v.detail


def test_the_perf_pods_figures_are_judged_by_inspects_check_against_the_reference() -> None:
    refs = {"sandbox": {"gloo_allreduce_busbw_gbs": Reference(1.8, "median of pool sandbox (1 nodes)")},
            "h100": {"nccl_allreduce_busbw_gbs": Reference(460.0, "AzNHC check_nccl_allreduce 460.0")}}
    ok = perf_gate({"gloo_allreduce_busbw_gbs": 1.71}, "sandbox", setup(refs=refs))
    assert ok == (True, "performance gloo_allreduce_busbw_gbs 1.71 = 95% (floor 90%)")
    passed, detail = perf_gate({"nccl_allreduce_busbw_gbs": 200.0}, "h100", setup(refs=refs))
    assert not passed
    assert "GFI050 perf-collective-low" in detail and "43.5% of 460" in detail and "AzNHC" in detail
    assert perf_gate({"nccl_allreduce_busbw_gbs": 200.0}, "h100", setup(floor=40.0, refs=refs))[0]
    # Nothing measured never passes; a figure without a reference is said, not failed.
    assert perf_gate({}, "sandbox", setup(refs=refs)) == (False, "performance: the probe measured nothing")
    passed, detail = perf_gate({"h2d_gbs": 50.0}, "sandbox", setup(refs=refs))
    assert passed and detail == "performance not compared: perf h2d_gbs: no reference (SKU table or pool)"
