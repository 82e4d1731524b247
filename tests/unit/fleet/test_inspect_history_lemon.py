"""History store, deltas and the lemon rule on recorded and seeded synthetic histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.fleet.inspect import history as H
from gpufleet.fleet.inspect.checks import Pins
from gpufleet.fleet.inspect.lemon import bottom_nodes, lemons
from gpufleet.fleet.inspect.report import to_doc, to_html, to_junit
from gpufleet.fleet.inspect.sweep import SweepOutcome, run_sweep
from gpufleet.fleet.inspect.synthetic import Degradations, fleet_runs
from gpufleet.fleet.inspect.thresholds import load_thresholds

CAT = load_catalog()
RULES, _ = xid_policy(CAT, {})
T = load_thresholds()
NODES = ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "spare-0"]
DEG = Degradations(slow="gpu-1", ecc="gpu-2", flap="spare-0")


def sweeps(nodes: list[str], runs: int, seed: int, deg: Degradations
           ) -> tuple[list[SweepOutcome], list[H.NodeRecord]]:
    past: list[H.NodeRecord] = []
    outs = []
    for i, obs in enumerate(fleet_runs(nodes, runs, seed, deg)):
        out = run_sweep(run_id=f"r{i}", stack="sandbox", level="full", at=obs[0].at, observations=obs,
                        past=past, thresholds=T, xid_rules=RULES, pins={"gpu": Pins()})
        past += out.records
        outs.append(out)
    return outs, past


@pytest.mark.parametrize("seed", range(100))
def test_all_three_degradations_are_lemons_and_no_healthy_node_is(seed: int) -> None:
    outs, _ = sweeps(NODES, 7, seed, DEG)
    assert {lm.node for lm in outs[-1].lemons} == {"gpu-1", "gpu-2", "spare-0"}


@pytest.mark.parametrize("seed", range(100))
def test_no_lemon_in_a_healthy_pool(seed: int) -> None:
    outs, _ = sweeps(NODES, 7, 1000 + seed, Degradations())
    assert outs[-1].lemons == ()


def test_a_larger_pool_flags_exactly_the_degraded_nodes() -> None:
    nodes = [f"gpu-{i}" for i in range(64)]
    outs, _ = sweeps(nodes, 7, 7, Degradations(slow="gpu-5", ecc="gpu-17", flap="gpu-40"))
    assert {lm.node for lm in outs[-1].lemons} == {"gpu-5", "gpu-17", "gpu-40"}


def test_two_bottom_sweeps_are_not_yet_a_lemon() -> None:
    outs, _ = sweeps(NODES, 2, 3, DEG)
    assert outs[-1].lemons == ()


def test_the_slow_node_fails_its_floor_and_the_flapping_port_its_check() -> None:
    outs, _ = sweeps(NODES, 2, 5, DEG)
    rows = {r.result.node: r for r in outs[-1].rows}
    assert "GFI050" in {f.code for f in rows["gpu-1"].result.findings}
    assert "GFI033" in {f.code for f in rows["spare-0"].result.findings}
    assert rows["gpu-2"].deltas["ecc_correctable"] > 0  # rising between sweeps


def test_job_exclusions_make_a_lemon() -> None:
    outs, past = sweeps(NODES, 1, 1, Degradations())
    obs = outs[0].records[0].observation.model_copy(update={"job_exclusions": 3, "at": outs[0].at + 60})
    rec = H.NodeRecord(run_id="x", at=obs.at, stack="sandbox", level="light", node=obs.node, pool="gpu",
                       status="ok", metrics={"job_exclusions": 3.0}, observation=obs)
    found = lemons([*past, rec], now=obs.at)
    assert [(lm.node, lm.exclusions) for lm in found] == [("gpu-0", 3)]
    assert lemons([*past, rec], now=obs.at + 8 * 86400) == []  # outside the 7-day window


def test_bottom_needs_distance_from_the_pool_not_only_rank() -> None:
    assert bottom_nodes({"a": 100.0, "b": 99.0, "c": 101.0, "d": 100.5}, "perf:x:pct") == set()
    assert bottom_nodes({"a": 100.0, "b": 85.0, "c": 101.0, "d": 100.5}, "perf:x:pct") == {"b"}
    assert bottom_nodes({"a": 0.0, "b": -1.0, "c": 0.0, "d": 0.0}, "ecc_correctable_increase") == set()
    assert bottom_nodes({"a": 0.0, "b": -50.0, "c": 0.0, "d": 0.0}, "ecc_correctable_increase") == {"b"}


def test_history_round_trip_deltas_and_a_torn_line(tmp_path: Path) -> None:
    outs, _ = sweeps(NODES, 2, 9, DEG)
    path = H.history_path(tmp_path, "sandbox")
    for o in outs:
        H.append(path, o.records)
    with open(path, "a") as fh:
        fh.write('{"run_id": "torn')  # a sweep killed mid-append
    back = H.load(path)
    assert back == [r for o in outs for r in o.records]
    last = H.last_observations(back)
    assert last["gpu-0"] == outs[1].records[0].observation
    assert H.deltas({"a": 5.0, "b": 1.0}, back[0].model_copy(update={"metrics": {"a": 2.0}})) == {"a": 3.0}


def test_a_record_that_does_not_fit_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"run_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"h.jsonl: line 1: not an inspect history record"):
        H.load(path)


def test_report_has_a_row_per_node_with_trends_and_lemons() -> None:
    outs, _ = sweeps(NODES, 7, 11, DEG)
    doc = to_doc(outs[-1], CAT)
    assert [n["node"] for n in doc["nodes"]] == NODES
    assert sorted(doc["lemons"]) == ["gpu-1", "gpu-2", "spare-0"]
    slow = next(n for n in doc["nodes"] if n["node"] == "gpu-1")
    assert len(slow["trends"]["perf:nccl_allreduce_busbw_gbs:pct"]) == 7
    assert slow["findings"][0]["runbook"] == "runbooks/FabricLinkDegraded.md"
    html = to_html(doc)
    assert html.count("<tr class=") == len(NODES) and "lemon" in html
    junit = to_junit(doc)
    assert junit.count("<testcase ") == len(NODES) and 'type="GFI050"' in junit
