"""Behavioural properties of the simulator (STYLE.md point 11)."""

from __future__ import annotations

import itertools

import numpy as np
from sim_testdata import fault, llama3_catalog, stack

from gpufleet.catalog import Catalog
from gpufleet.sim import account, mean_ci, replication_seeds, resolve, run_replications, simulate_once
from gpufleet.sim.metrics import ettr_values, summarize
from gpufleet.sim.params import SimParams


def _small(days: float = 20, **kw: object) -> SimParams:
    return resolve(stack(nodes=64, spares=4, **kw), llama3_catalog(), days=days)  # type: ignore[arg-type]


def _same(a: object, b: object) -> bool:
    da, db = vars(a), vars(b)
    return da.keys() == db.keys() and all(
        np.array_equal(da[k], db[k]) if isinstance(da[k], np.ndarray) else da[k] == db[k] for k in da)


def test_same_seed_same_result_and_another_seed_differs() -> None:
    p = _small(days=54)
    seed = replication_seeds(7, 1)[0]
    a, b = simulate_once(p, seed), simulate_once(p, seed)
    assert _same(a, b)
    c = simulate_once(p, replication_seeds(8, 1)[0])
    assert not _same(a, c)


def test_serial_equals_parallel() -> None:
    p = _small(days=30)
    serial = run_replications(p, seed=5, runs=6, workers=1)
    parallel = run_replications(p, seed=5, runs=6, workers=2)
    assert len(serial) == len(parallel) == 6
    assert all(_same(a, b) for a, b in zip(serial, parallel, strict=True))


def test_time_is_fully_accounted() -> None:
    p = _small(days=30).with_changes(kinds=tuple(
        k.__class__(**{**vars(k), "per_node_hour": k.per_node_hour * 20}) for k in _small().kinds))
    for r in run_replications(p, seed=2, runs=5, workers=1):
        a = account(r.run_start, r.run_end, r.run_cause, r.down_seconds_by_kind,
                    p.checkpoint_interval_seconds, p.checkpoint_write_seconds)
        total = a.useful + a.checkpoint_overhead + a.lost_work + a.down
        assert abs(total - p.horizon_seconds) < 1e-6 * p.horizon_seconds
        assert r.interruptions > 50  # the scaled rates really produce faults


def test_shorter_checkpoint_interval_with_free_writes_never_lowers_ettr() -> None:
    p = _small(days=30, write_seconds=0)
    results = run_replications(p, seed=9, runs=10, workers=1)
    # Each interval divides the next, so on every replication the saved work can only grow.
    chain = [3600.0, 1800.0, 600.0, 300.0, 60.0]
    values = [ettr_values(p, results, interval=dt, write=0.0) for dt in chain]
    for longer, shorter in itertools.pairwise(values):
        assert np.all(shorter >= longer - 1e-12)
    assert values[-1].mean() > values[0].mean() + 1e-3  # and it matters


def _hard_fleet(spares: int, mode: str = "warm") -> SimParams:
    # Frequent faults that need a replacement and repairs that take days: spares decide the ETTR.
    cat = Catalog((fault("f", "node-crash", "replace", 400.0, "crash"),))
    return resolve(stack(nodes=64, spares=spares, spare_mode=mode, interval_minutes=30,
                         detection={"node-crash": "active"}), cat, days=30)


def test_more_spares_never_lowers_ettr() -> None:
    grid = [0, 1, 2, 4, 8, 16]
    est = {s: mean_ci(ettr_values(p, run_replications(p, seed=4, runs=12, workers=1)))
           for s in grid for p in [_hard_fleet(s)]}
    for a, b in itertools.pairwise(grid):
        slack = (est[a].high - est[a].low) / 2 + (est[b].high - est[b].low) / 2
        assert est[b].mean >= est[a].mean - slack, (a, est[a], b, est[b])
    assert est[16].low > est[0].high  # spares make a real difference here


def test_warm_spares_beat_cold_spares() -> None:
    # Enough spares that nobody waits for repairs: the difference is the cold boot per fault.
    warm = summarize(p := _hard_fleet(40), run_replications(p, seed=1, runs=12, workers=1))
    cold = summarize(q := _hard_fleet(40, "cold"), run_replications(q, seed=1, runs=12, workers=1))
    assert warm.ettr.low > cold.ettr.high


def test_spares_exhaustion_and_availability() -> None:
    none = summarize(p := _hard_fleet(0), run_replications(p, seed=2, runs=8, workers=1))
    many = summarize(q := _hard_fleet(32), run_replications(q, seed=2, runs=8, workers=1))
    assert none.spares_exhausted.mean == 1.0
    assert many.spares_exhausted.mean < 1.0
    assert none.job_capacity_availability.mean < many.job_capacity_availability.mean
    assert 0.0 < none.node_availability.mean < 1.0


def test_leaf_switch_takes_down_its_nodes_and_trips_the_breaker() -> None:
    cat = Catalog((fault("sw", "fabric-switch-down", "none", 50.0, "switch"),))
    st = stack(nodes=64, spares=4, nodes_per_leaf=16, detection={"fabric-switch-down": "active"})
    p = resolve(st, cat, days=30)
    r = run_replications(p, seed=3, runs=4, workers=1)
    assert sum(x.breaker_trips for x in r) > 0  # 16 of 68 nodes is past the 5% breaker
    assert all(x.node_down_seconds > 0 for x in r)
    loose = p.with_changes(breaker_max_share=1.0)
    r2 = run_replications(loose, seed=3, runs=4, workers=1)
    assert sum(x.breaker_trips for x in r2) == 0
    # Without the breaker, isolation is automatic: less time lost than with manual handling.
    assert np.mean(ettr_values(loose, r2)) > np.mean(ettr_values(p, r))


def test_lemons_keep_the_fleet_rate_and_recurrence_raises_it() -> None:
    base = _small(days=54)
    lemon = base.with_changes(lemon_fraction=0.05, lemon_multiplier=10.0)
    worse = base.with_changes(recurrence_factor=3.0)
    f = {name: mean_ci([float(r.faults_by_kind.sum())
                        for r in run_replications(p, seed=6, runs=30, workers=1)])
         for name, p in (("base", base), ("lemon", lemon), ("worse", worse))}
    slack = (f["base"].high - f["base"].low) + (f["lemon"].high - f["lemon"].low)
    assert abs(f["lemon"].mean - f["base"].mean) < slack
    assert f["worse"].low > f["base"].high


def test_weibull_infant_mortality_front_loads_faults() -> None:
    from gpufleet.core.taxonomy import FaultClass

    base = resolve(stack(nodes=64, spares=0), Catalog((fault("f", "gpu-contained", "restart-job",
                                                              300.0),)), days=30)
    h = base.handling[FaultClass.GPU_CONTAINED]
    shaped = base.with_changes(handling={**base.handling, FaultClass.GPU_CONTAINED:
                                         h.__class__(**{**vars(h), "weibull_shape": 0.5})})

    def first_week_share(p: SimParams) -> float:
        rs = run_replications(p, seed=1, runs=10, workers=1)
        ends = np.concatenate([r.run_end[r.run_cause >= 0] for r in rs])
        return float(np.mean(ends < 7 * 86400))

    assert first_week_share(shaped) > first_week_share(base) + 0.1
