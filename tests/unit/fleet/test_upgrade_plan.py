"""The upgrade planner and the stack's upgrade policy, as tables: canary per pool, waves of waveSize,
nodes left out with their reason, counts and percentages resolved against the fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.config import UpgradeSpec, share_of
from gpufleet.config.load import parse_stack, read_yaml, stack_data
from gpufleet.core.errors import InputError
from gpufleet.fleet.upgrade import (
    FleetSnapshot,
    Job,
    NodeObservation,
    SkipReason,
    plan_upgrade,
    protection,
    snapshot_from_stack,
    with_protection,
)

STACKS = Path(__file__).parents[3] / "stacks"
TARGET = "570.124.06"


def node(name: str, pool: str = "a", version: str | None = "550", **kw: Any) -> NodeObservation:
    return NodeObservation(name=name, pool=pool, version=version, **kw)


def fleet(*nodes: NodeObservation) -> FleetSnapshot:
    return FleetSnapshot(source="live", nodes=list(nodes))


@pytest.mark.parametrize(
    ("share", "total", "allowed"),
    [
        (1, 1250, 1),
        (7, 10, 7),
        ("10%", 1250, 125),
        ("2%", 1250, 25),
        ("1%", 50, 1),  # rounds down to 0, kept at 1 so a small fleet can be upgraded
        ("33%", 10, 3),  # 3.3 rounds down, as Kubernetes rounds maxUnavailable
        ("100%", 8, 8),
    ],
)
def test_share_of_a_fleet(share: int | str, total: int, allowed: int) -> None:
    assert share_of(share, total) == allowed


PLANS = [
    # (what, nodes, spec, expected waves, expected left out, expected up to date)
    (
        "one pool: canary then waves of 2",
        [node(f"n{i}") for i in range(6)],
        {"waveSize": 2},
        [["n0"], ["n1", "n2"], ["n3", "n4"], ["n5"]],
        [],
        [],
    ),
    (
        "one canary per pool, then the pools in order",
        [node("a0"), node("b0", "b"), node("a1"), node("b1", "b")],
        {"waveSize": 3},
        [["a0", "b0"], ["a1", "b1"]],
        [],
        [],
    ),
    (
        "the canary is the idlest node; the others keep their order",
        [node("n0", jobs=[Job(id="1", protected=True)]), node("n1", jobs=[Job(id="2")]), node("n2")],
        {"waveSize": 5},
        [["n2"], ["n0", "n1"]],
        [],
        [],
    ),
    (
        "cordoned by others and unhealthy nodes are left out; nodes at the target are up to date",
        [node("n0", cordoned_by="alice"), node("n1", healthy=False), node("n2", version=TARGET), node("n3")],
        {},
        [["n3"]],
        [("n0", SkipReason.CORDONED_BY_OTHER), ("n1", SkipReason.UNHEALTHY)],
        ["n2"],
    ),
    (
        "two canaries per pool and a percentage wave size",
        [node(f"n{i}") for i in range(10)],
        {"canaryNodesPerPool": 2, "waveSize": "40%"},
        [["n0", "n1"], ["n2", "n3", "n4", "n5"], ["n6", "n7", "n8", "n9"]],
        [],
        [],
    ),
    ("nothing to do", [node("n0", version=TARGET)], {}, [], [], ["n0"]),
]


@pytest.mark.parametrize(("what", "nodes", "spec", "waves", "left_out", "up_to_date"), PLANS,
                         ids=[p[0] for p in PLANS])
def test_plan_table(what: str, nodes: list[NodeObservation], spec: dict[str, Any], waves: list[list[str]],
                    left_out: list[tuple[str, SkipReason]], up_to_date: list[str]) -> None:
    plan = plan_upgrade(fleet(*nodes), UpgradeSpec.model_validate(spec), TARGET)
    assert [list(w.nodes) for w in plan.waves] == waves
    assert [w.canary for w in plan.waves] == [i == 0 for i in range(len(waves))]
    assert [(s.node, s.reason) for s in plan.left_out] == left_out
    assert list(plan.up_to_date) == up_to_date
    planned = [n for w in waves for n in w]
    assert len(planned) == len(set(planned)) == plan.planned_nodes
    # every node is accounted for exactly once
    assert sorted(planned + [n for n, _ in left_out] + up_to_date) == sorted(n.name for n in nodes)


def test_plan_document_names_the_policy_and_the_source() -> None:
    plan = plan_upgrade(fleet(node("n0"), node("n1", cordoned_by="bob")), UpgradeSpec(), TARGET)
    doc = plan.to_doc()
    assert doc["source"] == "live"
    assert doc["policy"]["maxUnavailable"] == 1
    assert doc["policy"]["drainTimeoutSeconds"] == 300.0
    assert doc["waves"] == [{"index": 0, "canary": True, "nodes": ["n0"]}]
    assert doc["leftOut"] == [{"node": "n1", "reason": "cordoned-by-other", "detail": "cordoned by bob"}]


def test_protected_jobs_by_queue_or_name() -> None:
    spec = UpgradeSpec.model_validate({"protectedJobs": {"queues": ["prod"], "namePatterns": ["llm-*"]}})
    assert protection(spec, Job(id="1", queue="prod"))
    assert protection(spec, Job(id="2", name="llm-70b-pretrain", queue="batch"))
    assert not protection(spec, Job(id="3", name="eval-llm", queue="batch"))


def test_the_stacks_protection_is_added_to_a_snapshots_flags() -> None:
    spec = UpgradeSpec.model_validate({"protectedJobs": {"queues": ["prod"]}})
    snap = fleet(node("n0", jobs=[Job(id="1", queue="prod"), Job(id="2", queue="batch")]),
                 node("n1", jobs=[Job(id="3", queue="batch", protected=True)]))
    flags = [[j.protected for j in n.jobs] for n in with_protection(snap, spec).nodes]
    assert flags == [[True, False], [True]]


def test_snapshot_from_the_sandbox_stack_knows_no_versions() -> None:
    stack = parse_stack(stack_data(read_yaml(STACKS / "Pulumi.h200-ib.yaml"), "h200"), "h200")
    snap = snapshot_from_stack(stack)
    assert snap.source == "stack"
    assert len(snap.nodes) == stack.total_nodes
    plan = plan_upgrade(snap, stack.upgrade, TARGET)
    assert plan.unknown_version == stack.total_nodes
    assert plan.planned_nodes == stack.total_nodes


def stack_with_upgrade(upgrade: Any) -> dict[str, Any]:
    data = stack_data(read_yaml(STACKS / "Pulumi.h200-ib.yaml"), "h200")
    return {**data, "upgrade": upgrade}


@pytest.mark.parametrize(
    ("upgrade", "path", "message"),
    [
        ({"maxUnavailible": 2}, "upgrade.maxUnavailible", "unknown key"),
        ({"maxUnavailable": 0}, "upgrade.maxUnavailable", ">= 1"),
        ({"waveSize": "0%"}, "upgrade.waveSize", "pattern"),
        ({"waveSize": "150%"}, "upgrade.waveSize", "pattern"),
        ({"gate": {"performanceFloorPercent": 120}}, "upgrade.gate.performanceFloorPercent", "<= 100"),
        ({"drainTimeoutSeconds": 0}, "upgrade.drainTimeoutSeconds", "> 0"),
        ({"protectedJobs": {"partitions": ["x"]}}, "upgrade.protectedJobs.partitions", "unknown key"),
    ],
)
def test_bad_upgrade_policy_is_refused_with_its_path(upgrade: Any, path: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_stack(stack_with_upgrade(upgrade), "s.yaml")
    found = [str(p) for p in err.value.problems if p.path.startswith(path)]
    assert found, err.value.render()
    assert any(message in f for f in found), found


def test_configured_zero_bake_is_kept() -> None:
    stack = parse_stack(stack_with_upgrade({"bakeSeconds": 0, "maxUnavailable": "5%"}), "s.yaml")
    assert stack.upgrade.bake_seconds == 0
    assert stack.upgrade.max_unavailable == "5%"


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(ValueError, match="node names repeat: n0"):
        fleet(node("n0"), node("n0"))
