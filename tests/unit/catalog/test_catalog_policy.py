"""XID policy overrides and conflicts, dedup of echoes (XID 45 after 79), escalation."""

from __future__ import annotations

import pytest

from gpufleet.catalog import (
    Catalog,
    Observation,
    OverrideSpec,
    actionable,
    escalated_action,
    load_catalog,
    xid_policy,
)
from gpufleet.core.taxonomy import FaultClass, LadderAction


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_policy_without_overrides_is_the_catalog(catalog: Catalog) -> None:
    table, problems = xid_policy(catalog, {})
    assert problems == []
    assert table[79].action is LadderAction.REBOOT_NODE and table[79].source == "catalog"
    assert table[45].action is LadderAction.NONE
    assert set(table) == set(catalog.by_xid())


def test_override_makes_a_contained_xid_stricter(catalog: Catalog) -> None:
    table, problems = xid_policy(catalog, {13: OverrideSpec(LadderAction.RESET_GPU, "lemon GPUs")})
    assert problems == []
    assert table[13].action is LadderAction.RESET_GPU
    assert table[13].fault_class is FaultClass.GPU_FATAL
    assert table[13].source == "stack override: lemon GPUs"


def test_override_that_stops_isolating_a_fatal_xid_is_a_conflict(catalog: Catalog) -> None:
    table, problems = xid_policy(catalog, {79: OverrideSpec(LadderAction.RESTART_JOB, "optimism")})
    assert [p.path for p in problems] == ["remediation.xidOverrides.79"]
    assert "conflict" in problems[0].message
    assert table[79].action is LadderAction.REBOOT_NODE  # the conflicting override is not applied


def test_unknown_xid_needs_a_class(catalog: Catalog) -> None:
    _, problems = xid_policy(catalog, {140: OverrideSpec(LadderAction.RESET_GPU, "B200 ECC")})
    assert problems and "give faultClass" in problems[0].message
    table, problems = xid_policy(
        catalog, {140: OverrideSpec(LadderAction.RESET_GPU, "B200 ECC", FaultClass.GPU_FATAL)})
    assert problems == [] and table[140].fault_id is None and table[140].action is LadderAction.RESET_GPU


def test_xid45_after_xid79_is_an_echo(catalog: Catalog) -> None:
    primary = Observation("gpu-xid-79", "gpu-0", 3, at=100.0)
    echo = Observation("gpu-xid-45", "gpu-0", 5, at=130.0)
    assert actionable(primary, [], catalog)
    assert not actionable(echo, [primary], catalog)


def test_xid45_alone_or_on_another_node_or_after_the_window_is_not_an_echo(catalog: Catalog) -> None:
    alone = Observation("gpu-xid-45", "gpu-0", 5, at=130.0)
    assert actionable(alone, [], catalog)
    other_node = Observation("gpu-xid-79", "gpu-1", 3, at=100.0)
    assert actionable(alone, [other_node], catalog)
    long_ago = Observation("gpu-xid-79", "gpu-0", 3, at=100.0 - 10_000)
    assert actionable(alone, [long_ago], catalog)


def test_repeats_on_one_gpu_count_once_within_the_window(catalog: Catalog) -> None:
    first = Observation("gpu-xid-95", "gpu-0", 2, at=0.0)
    again = Observation("gpu-xid-95", "gpu-0", 2, at=60.0)
    other_gpu = Observation("gpu-xid-95", "gpu-0", 4, at=60.0)
    later = Observation("gpu-xid-95", "gpu-0", 2, at=10_000.0)
    assert not actionable(again, [first], catalog)
    assert actionable(other_gpu, [first], catalog)
    assert actionable(later, [first], catalog)


def test_port_down_behind_a_down_switch_is_an_echo(catalog: Catalog) -> None:
    switch = Observation("fabric-switch-down", "gpu-0", None, at=0.0)
    port = Observation("fabric-port-down", "gpu-0", None, at=20.0)
    assert not actionable(port, [switch], catalog)
    assert actionable(port, [], catalog)


def test_escalation_climbs_the_ladder_after_repeats(catalog: Catalog) -> None:
    f = catalog.get("gpu-xid-79")
    assert escalated_action(f, 1) is LadderAction.REBOOT_NODE
    assert escalated_action(f, 2) is LadderAction.REPLACE
    xid45 = catalog.get("gpu-xid-45")
    assert escalated_action(xid45, 1000) is LadderAction.NONE  # bursts never quarantine


def test_every_escalation_climbs(catalog: Catalog) -> None:
    for f in catalog:
        if f.escalation:
            assert f.escalation.to.rank > f.action.rank, f.id
