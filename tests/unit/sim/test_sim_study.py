"""The study around the replications (issue 18): sensitivity, the incremental spare sweep, progress,
the game-day projection beside its measurements, and the calibration statement."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from sim_testdata import fault, llama3_catalog, stack

from gpufleet.catalog import Catalog
from gpufleet.core.taxonomy import FaultClass
from gpufleet.sim import parse_report, resolve, run_replications, run_study, write_study
from gpufleet.sim.sweeps import spare_grid, spare_sweep


def test_sensitivity_to_detection_and_write_cost() -> None:
    p = resolve(stack(nodes=64, spares=4), llama3_catalog(), days=30)  # every class passive
    s = run_study(p, seed=1, runs=6, workers=1, sweep_spares=False)
    det = {row["mode"]: row["ettr"]["mean"] for row in s.sensitivity["detection"]}
    assert det["all active"] > det["all passive"]
    assert det["as configured"] == det["all passive"]  # the stack detects nothing actively
    writes = [row["ettr"]["mean"] for row in s.sensitivity["checkpoint_write"]]
    assert [row["factor"] for row in s.sensitivity["checkpoint_write"]] == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert all(a > b for a, b in itertools.pairwise(writes))  # dearer writes, lower ETTR
    assert "bookkeeping" in s.as_dict()["calibration"]


def test_spare_sweep_stops_once_spares_never_run_out() -> None:
    cat = Catalog((fault("f", "node-crash", "replace", 400.0, "crash"),))
    p = resolve(stack(nodes=64, spares=4, detection={"node-crash": "active"}), cat, days=30)
    assert spare_grid(p) == [0, 1, 2, 4, 8]  # 0, powers of two to 8% of the nodes, the stack's 4
    assert spare_grid(p.with_changes(job_nodes=16_384, spares=512))[:3] == [0, 16, 32]  # from ~0.1%
    grid = [0, 4, 16, 32, 48, 60]
    calls: list[tuple[int, int]] = []
    points, simulated = spare_sweep(p, 3, 4, grid, 1, progress=lambda d, t: calls.append((d, t)))
    assert [pt.x for pt in points] == [float(g) for g in grid]
    first_safe = next(pt for pt in points if pt.derived_from is None and pt.p_exhausted is not None
                      and pt.p_exhausted.mean == 0.0)
    later = [pt for pt in points if pt.x > first_safe.x]
    assert later and all(pt.derived_from == first_safe.x and pt.ettr == first_safe.ettr for pt in later)
    assert set(simulated) == {int(pt.x) for pt in points if pt.derived_from is None}
    assert calls[-1] == (len(grid), len(grid))
    # Reusing the main run at a count gives the very same replications (same seeds).
    main = run_replications(p.with_changes(spares=8), 3, 6, workers=1)
    _, again = spare_sweep(p, 3, 4, [8], 1, reuse={8: main})
    assert [r.events for r in again[8]] == [r.events for r in main[:4]]


def test_progress_reports_every_stage() -> None:
    p = resolve(stack(nodes=32, spares=2), llama3_catalog(), days=10)
    seen: dict[str, tuple[int, int]] = {}
    run_study(p, seed=1, runs=4, workers=1, progress=lambda st, d, t: seen.__setitem__(st, (d, t)))
    assert seen["replications"] == (4, 4)
    assert seen["sensitivity"] == (2, 2)
    assert seen["spares"][0] == seen["spares"][1] > 0


def test_gameday_measurements_sit_beside_the_projection(tmp_path: Path) -> None:
    report = {"experiments": [
        {"name": "a", "fault_class": "gpu-fatal",
         "measured": {"detect_seconds": 10, "isolate_seconds": 40, "recover_seconds": 200}},
        {"name": "b", "fault_class": "gpu-fatal",
         "measured": {"detect_seconds": 30, "isolate_seconds": 90, "recover_seconds": 300}},
    ]}
    m = parse_report(report, "r.json")
    p = resolve(stack(nodes=64, spares=4), llama3_catalog(), measured=m, report_file="r.json", days=20)
    assert p.handling[FaultClass.GPU_FATAL].measured == ((10.0, 30.0, 160.0), (30.0, 60.0, 210.0))
    s = run_study(p, seed=1, runs=4, workers=1, sweep_spares=False)
    (g,) = s.gameday
    assert g["fault_class"] == "gpu-fatal" and g["experiments"] == 2
    assert g["measured"]["detect_seconds"] == 20.0 and g["measured"]["detect_range"] == [10.0, 30.0]
    assert g["projected"]["job_gpus"] == 512
    # The restart at size is never shorter than the measured one (median 185 s; 260 s at 512 GPUs
    # would be the model's own: 60 s load + 200 x (512/16384)^0.839 = 60 + 11).
    assert g["projected"]["restart_seconds"] == max(p.restart_seconds, 185.0)
    assert g["projected"]["interruptions_per_run"] > 0
    files = write_study(s, tmp_path, plots=False)
    md = (tmp_path / "simulate.md").read_text()
    assert tmp_path / "simulate.md" in files
    assert "Game-day measurements" in md and "| gpu-fatal | 2 | 20 |" in md
    assert "Sensitivity of ETTR" in md and "all passive" in md


def test_a_detection_mode_that_changes_nothing_reuses_the_main_replications(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.sim.runner import run_replications as real

    calls: list[int] = []

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr("gpufleet.sim.study.run_replications", counted)
    p = resolve(stack(nodes=32, spares=2), llama3_catalog(), days=10)  # every class passive
    s = run_study(p, seed=1, runs=3, workers=1, sweep_spares=False)
    assert len(calls) == 2  # the main run and "all active"; "all passive" is the main run
    det = {row["mode"]: row["ettr"] for row in s.sensitivity["detection"]}
    assert det["all passive"] == det["as configured"]


def test_runs_chosen_by_precision_are_the_first_runs_of_the_fixed_study() -> None:
    from gpufleet.sim.study import MIN_PRECISE_RUNS, ettr_half_width, precise_runs

    p = resolve(stack(nodes=32, spares=2), llama3_catalog(), days=10)
    # A loose precision stops at the minimum; those runs are the fixed study's first ones, seed by seed.
    loose, how = precise_runs(p, 1, 1.0, 200, 1)
    assert len(loose) == MIN_PRECISE_RUNS and how["half_width"] <= 1.0
    fixed = run_replications(p, 1, 14, workers=1)
    assert [r.events for r in loose] == [r.events for r in fixed[:MIN_PRECISE_RUNS]]
    # An unreachable one doubles until the cap: 10, then 4 more (the cap), the same sequence.
    capped, how = precise_runs(p, 1, 1e-12, 14, 1)
    assert [r.events for r in capped] == [r.events for r in fixed]
    assert how["half_width"] == ettr_half_width(p, capped) > 1e-12 and how["max_runs"] == 14


def test_a_study_by_precision_says_how_its_runs_were_chosen() -> None:
    p = resolve(stack(nodes=32, spares=2), llama3_catalog(), days=10)
    seen: dict[str, tuple[int, int]] = {}
    s = run_study(p, seed=1, runs=40, precision=0.5, workers=1, sweep_spares=False, do_sensitivity=False,
                  progress=lambda st, d, t: seen.__setitem__(st, (d, t)))
    assert s.runs == 10 and s.metrics.ettr.n == 10
    assert seen["replications"] == (10, 40)  # done of the most it could run
    doc = s.as_dict()["runs_chosen_by_precision"]
    assert doc["target_half_width"] == 0.5 and doc["min_runs"] == 10 and doc["max_runs"] == 40
    assert run_study(p, seed=1, runs=4, workers=1, sweep_spares=False,
                     do_sensitivity=False).as_dict()["runs_chosen_by_precision"] is None
