"""Killed runs' network objects (gpufleet.sandbox.leftovers): grouped by the run id in their names,
and a run that a state root records (a readable state file, or its run folder) is never a leftover."""

from __future__ import annotations

from pathlib import Path

from gpufleet.sandbox import layout
from gpufleet.sandbox.leftovers import group_by_run, recorded_runs


def test_objects_are_grouped_by_the_run_in_their_names() -> None:
    run = "ab22f3"
    namespaces = [layout.netns_name(run, n) for n in ("head", "gpu-0", "gpu-1")]
    links = [layout.mgmt_bridge(run), layout.fabric_bridge(run, 0), layout.mgmt_peer(run, None),
             layout.mgmt_peer(run, 0), layout.fabric_peer(run, 1, 0)]
    others = ["gfdoctor-1a2b3c", "gf-ab22f-gpu-0", "eth0", "docker0", "gf-ab22f3", "gfab22f3x"]
    runs = group_by_run([*namespaces, "gf-0011aa-gpu-0", *others], [*links, *others])
    assert sorted(runs) == ["0011aa", run]
    assert runs[run].namespaces == sorted(namespaces)
    assert runs[run].links == sorted(links)
    assert runs["0011aa"].links == []


def test_a_recorded_run_is_not_a_leftover(tmp_path: Path) -> None:
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "state.json").write_text("{not json")  # unreadable: its runs still count
    (tmp_path / "sandbox" / "run-ab22f3").mkdir()
    (tmp_path / "other").mkdir()  # no state file: its run folder is no record
    (tmp_path / "other" / "run-0011aa").mkdir()
    assert recorded_runs(tmp_path) == {"ab22f3"}
    assert recorded_runs(tmp_path / "absent") == set()
