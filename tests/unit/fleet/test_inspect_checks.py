"""The inspect checks as table tests over typed observations (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.fleet.inspect.checks import Context, Pins, Reference, check_node, flaps_since
from gpufleet.fleet.inspect.contracts import NPD_MAX_OUTPUT, drain_reason, exit_code, npd_message
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs
from gpufleet.fleet.inspect.plan import decide, pair_quick, plan_sweep
from gpufleet.fleet.inspect.thresholds import load_thresholds

CAT = load_catalog()
RULES, _ = xid_policy(CAT, {})
T = load_thresholds()
PINS = Pins(driver="570.124.06", firmware="96.00.9F.00.01")


def node(**kw: Any) -> NodeObservation:
    base: dict[str, Any] = dict(
        node="gpu-0", pool="gpu", sku=AcceleratorModel.H100_SXM, at=1000.0, expected_gpus=8,
        sched_state="idle", gpus=tuple(GpuObs(index=i, pcie_gen=5, pcie_width=16) for i in range(8)),
        ports=(PortObs(name="fab0", state="up", speed_gbps=400.0, carrier_changes=2),),
        expected_port_gbps=400.0, driver_version="570.124.06", firmware_version="96.00.9F.00.01",
    )
    base.update(kw)
    return NodeObservation(**base)


def gpu(i: int = 3, **kw: Any) -> tuple[GpuObs, ...]:
    return tuple(GpuObs(**{"index": g, "pcie_gen": 5, "pcie_width": 16, **(kw if g == i else {})})
                 for g in range(8))


CTX = Context(T, RULES, PINS, {"nccl_allreduce_busbw_gbs": Reference(460.0, "AzNHC")}, 90.0, "full",
              {f.id: f.action for f in CAT})


@pytest.mark.parametrize(
    ("label", "obs", "status", "codes", "faults"),
    [
        ("healthy", node(), "ok", [], []),
        ("7 of 8 GPUs", node(gpus=gpu()[:7]), "fail", ["GFI001"], ["gpu-missing"]),
        ("XID 79 isolates", node(gpus=gpu(xids=(79,))), "fail", ["GFI002"], ["gpu-xid-79"]),
        ("XID 13 is contained", node(gpus=gpu(xids=(13,))), "warn", ["GFI003"], ["gpu-xid-13"]),
        ("remap pending", node(gpus=gpu(row_remap_pending=1)), "fail", ["GFI010"], ["gpu-row-remap-pending"]),
        ("health source: thermal", node(gpus=gpu(health_fault="gpu-thermal")), "fail", ["GFI004"],
         ["gpu-thermal"]),
        ("health source: contained", node(gpus=gpu(health_fault="gpu-xid-13")), "warn", ["GFI005"],
         ["gpu-xid-13"]),
        ("health source: unknown fault", node(gpus=gpu(health_fault="no-such-fault")), "fail", ["GFI004"],
         ["no-such-fault"]),
        ("XID and its held fault once", node(gpus=gpu(xids=(79,), health_fault="gpu-xid-79")), "fail",
         ["GFI002"], ["gpu-xid-79"]),
        ("remap failed", node(gpus=gpu(row_remap_failed=1)), "fail", ["GFI011"], ["gpu-xid-64"]),
        ("513 remapped rows", node(gpus=gpu(uncorrectable_remapped_rows=513)), "fail", ["GFI012"],
         ["gpu-xid-64"]),
        ("512 remapped rows pass", node(gpus=gpu(uncorrectable_remapped_rows=512)), "ok", [], []),
        ("one DBE", node(gpus=gpu(ecc_uncorrectable_volatile=1)), "fail", ["GFI013"], ["gpu-xid-48"]),
        ("10001 SBE warn", node(gpus=gpu(ecc_correctable_volatile=10001)), "warn", ["GFI014"],
         ["gpu-xid-92"]),
        ("PCIe x8", node(gpus=gpu(pcie_width=8)), "fail", ["GFI020"], ["gpu-pcie-replay"]),
        ("PCIe Gen4", node(gpus=gpu(pcie_gen=4)), "fail", ["GFI021"], ["gpu-pcie-replay"]),
        ("port down", node(ports=(PortObs(name="fab0", state="down", carrier_changes=3),)), "fail",
         ["GFI030"], ["fabric-port-down"]),
        ("port absent", node(ports=(PortObs(name="fab0", state="absent"),)), "fail", ["GFI031"],
         ["fabric-nic-failure"]),
        ("port at 200G", node(ports=(PortObs(name="fab0", state="up", speed_gbps=200.0),)), "fail",
         ["GFI032"], ["fabric-link-degraded"]),
        ("driver drift", node(driver_version="550.90.07"), "warn", ["GFI040"], ["node-software-drift"]),
        ("firmware drift", node(firmware_version="96.00.74.00.01"), "warn", ["GFI041"],
         ["node-software-drift"]),
        ("busbw 89 %", node(perf={"nccl_allreduce_busbw_gbs": 409.4}), "fail", ["GFI050"],
         ["fabric-link-degraded"]),
        ("busbw 90 % passes", node(perf={"nccl_allreduce_busbw_gbs": 414.0}), "ok", [], []),
        ("no GPU source", node(gpus=None), "unknown", [], []),
        ("version unreported", node(driver_version=None), "unknown", [], []),
    ],
)
def test_checks(label: str, obs: NodeObservation, status: str, codes: list[str], faults: list[str]) -> None:
    r = check_node(obs, None, CTX, run_full=True)
    assert r.status == status, (label, r)
    assert sorted({f.code for f in r.findings}) == codes, label
    assert sorted({f.fault_id for f in r.findings if f.fault_id}) == faults, label


def test_flaps_count_lost_carrier_events_since_the_last_sweep() -> None:
    before = node(ports=(PortObs(name="fab0", state="up", carrier_changes=2),))
    now = node(ports=(PortObs(name="fab0", state="up", carrier_changes=8),))
    assert flaps_since(now.ports[0], before) == 3  # type: ignore[index]
    r = check_node(now, before, CTX, run_full=False)
    assert [f.code for f in r.findings] == ["GFI033"] and r.metrics["link_flaps"] == 3
    one = node(ports=(PortObs(name="fab0", state="up", carrier_changes=4),))
    assert check_node(one, before, CTX, run_full=False).status == "ok"  # one flap: within the limit
    rebooted = node(ports=(PortObs(name="fab0", state="up", carrier_changes=2),))
    assert flaps_since(rebooted.ports[0], now) == 1  # type: ignore[index]  # counter reset: counts from 0
    assert flaps_since(now.ports[0], None) is None  # type: ignore[index]


def test_perf_counts_only_when_the_full_checks_ran() -> None:
    r = check_node(node(perf={"nccl_allreduce_busbw_gbs": 100.0}), None, CTX, run_full=False)
    assert r.status == "ok" and not r.full and not any(k.startswith("perf:") for k in r.metrics)


def test_unpinned_versions_and_unobservable_pcie_are_skipped_with_reasons() -> None:
    ctx = Context(T, RULES, Pins(), {}, 90.0, "light")
    obs = node(gpus=tuple(GpuObs(index=i) for i in range(8)),
               not_observable={"pcie": "sandbox GPUs have no PCIe"})
    r = check_node(obs, None, ctx, run_full=False)
    assert r.status == "ok"
    assert any("sandbox GPUs have no PCIe" in s for s in r.skipped)
    assert any("pins no driver" in s for s in r.skipped) and any("pins no firmware" in s for s in r.skipped)


def test_a_sku_without_pcie_pins_skips_the_pcie_check() -> None:
    r = check_node(node(sku=AcceleratorModel.B200, gpus=gpu(pcie_width=1)), None, CTX, run_full=False)
    assert r.status == "ok" and any("no PCIe pin for nvidia-b200" in s and "no device reports its link "
                                    "capability" in s for s in r.skipped)


def test_without_a_pin_each_link_is_judged_against_its_own_capability() -> None:
    links = {0: (None, 16, 16), 1: (None, 4, 16), 2: (None, 8, None), 3: (1, 16, 16)}
    gpus = tuple(GpuObs(index=i, pcie_gen=gen, pcie_width=width, pcie_width_max=most)
                 for i in range(8) for gen, width, most in [links.get(i, (5, 16, 16))])
    r = check_node(node(sku=AcceleratorModel.B200, gpus=gpus), None, CTX, run_full=False)
    # GPU 1 narrower than it supports; GPU 2's capability unknown: not judged; GPU 3's generation
    # is not judged without a pin (an idle link trains its speed down).
    assert [(f.name, f.subject, f.value, f.limit) for f in r.findings] == [("pcie-width-low", "GPU 1", 4, 16)]
    assert not any(s.startswith("pcie:") for s in r.skipped)
    # a pinned SKU keeps its datasheet figure, whatever the device reports
    pinned = check_node(node(gpus=gpu(0, pcie_width=8, pcie_width_max=8)), None, CTX, run_full=False)
    assert [(f.name, f.limit) for f in pinned.findings] == [("pcie-width-low", 16)]


@pytest.mark.parametrize(
    ("state", "level", "full"),
    [("idle", "full", True), ("drained", "full", True), ("allocated", "full", False),
     ("mixed", "full", False), ("draining", "full", False), ("down", "full", False),
     ("unknown", "full", False), ("idle", "light", False)],
)
def test_heavy_checks_only_on_idle_or_drained_nodes(state: Any, level: Any, full: bool) -> None:
    assert decide(state, level)[0] is full


def test_plan_pairs_only_the_nodes_that_run_full_checks() -> None:
    states: list[tuple[str, Any]] = [("a", "idle"), ("b", "allocated"), ("c", "drained"), ("d", "idle"),
                                     ("e", "idle")]
    plan = plan_sweep(states, "full")
    assert [p.node for p in plan.nodes if p.full] == ["a", "c", "d", "e"]
    assert plan.pairs == (("a", "c"), ("d", "e")) and plan.unpaired == ()
    assert pair_quick(["x", "y", "z"]) == ((("x", "y"),), ("z",))


def test_contracts_exit_codes_and_messages() -> None:
    ok = check_node(node(), None, CTX, run_full=False)
    bad = check_node(node(gpus=gpu(xids=(79,), row_remap_pending=1)), None, CTX, run_full=False)
    warn = check_node(node(driver_version="550.90.07"), None, CTX, run_full=False)
    unk = check_node(node(gpus=None), None, CTX, run_full=False)
    assert [exit_code(r) for r in (ok, bad, warn, unk)] == [0, 1, 0, 2]
    assert npd_message(ok) == "OK: gpufleet inspect checks pass"
    assert npd_message(bad).startswith("PROBLEM: GFI002 gpu-xid GPU 3 (+1)")
    assert npd_message(warn) == "OK: warn GFI040"
    assert npd_message(unk).startswith("UNKNOWN: gpus:")
    assert all(len(npd_message(r)) <= NPD_MAX_OUTPUT for r in (ok, bad, warn, unk))
    assert drain_reason(bad) == "gpufleet inspect GFI002,GFI010: gpu-xid GPU 3"
    assert drain_reason(warn) is None and drain_reason(ok) is None
