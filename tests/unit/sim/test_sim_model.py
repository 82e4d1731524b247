"""Hand-computed cases of the model's additions (issue 18): scripted faults on a fleet whose own
fault clocks are negligible, with every time worked out by hand in the comments."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from sim_testdata import fault, stack

from gpufleet.catalog import Catalog
from gpufleet.core.taxonomy import FaultClass
from gpufleet.sim import mean_ci, replication_seeds, resolve, run_replications
from gpufleet.sim.accounting import (
    Accounting,
    StoreWindows,
    account,
    ettr_mixed_handling,
    ettr_renewal,
    save_costs,
)
from gpufleet.sim.engine import ReplicationResult, ScriptedFault, simulate_once
from gpufleet.sim.metrics import ettr_values
from gpufleet.sim.params import SimParams, UpgradeWave

TINY = 1e-9  # per 1M GPU-hours: the kinds exist, their own clocks never ring in a day
SEED = replication_seeds(1, 1)[0]


def _fleet(spares: int = 2, mode: str = "warm", **changes: object) -> SimParams:
    cat = Catalog((
        fault("slow", "node-crash", "replace", TINY, "slow"),
        fault("quick", "gpu-contained", "restart-job", TINY, "quick"),
        fault("reset", "gpu-degraded", "reset-gpu", TINY, "reset"),
    ))
    p = resolve(stack(nodes=4, spares=spares, spare_mode=mode,
                      detection={"node-crash": "active", "gpu-contained": "active",
                                 "gpu-degraded": "active"}), cat, days=1)
    # node-crash detect 2 s (ByteRobust OS fault), gpu-contained 10 s; restart fixed at 100 s;
    # no circuit breaker (1 node of 6 would trip the 5% default).
    assert p.handling[FaultClass.NODE_CRASH].detect_seconds == 2.0
    assert p.handling[FaultClass.GPU_CONTAINED].detect_seconds == 10.0
    return p.with_changes(restart_seconds=100.0, breaker_max_share=1.0, **changes)


def _isolate(p: SimParams, cls: FaultClass, seconds: float) -> SimParams:
    h = dataclasses.replace(p.handling[cls], isolate_seconds=seconds)
    return p.with_changes(handling={**p.handling, cls: h})


def _down(p: SimParams, r: ReplicationResult) -> dict[str, float]:
    return {k.fault_id: float(r.down_seconds_by_kind[i]) for i, k in enumerate(p.kinds)}


def test_a_quick_second_fault_does_not_cut_a_slow_first_one_short() -> None:
    # Slow: node 0 crashes at t=1000, a human isolates it (3,600 s): ready at 1000+2+3600 = 4602.
    # Quick: node 1 hits a contained GPU error at t=1100, detected at 1110. The job must still wait
    # for 4602, take a warm spare for node 0, and restart (100 s): running again at 4702.
    p = _isolate(_fleet(), FaultClass.NODE_CRASH, 3600.0)
    r = simulate_once(p, SEED, [ScriptedFault(1000.0, "slow", 0), ScriptedFault(1100.0, "quick", 1)])
    assert r.run_start.tolist() == [0.0, 4702.0]
    assert r.run_end.tolist() == [1000.0, 86400.0]
    assert r.interruptions == 2
    down = _down(p, r)
    assert down["slow"] == pytest.approx(100.0)  # 1000 -> 1100, then the latest fault owns it
    assert down["quick"] == pytest.approx(3602.0)  # 1100 -> 4702


def test_the_order_does_not_matter_when_the_slow_fault_comes_second() -> None:
    # Quick at 1000 (ready 1010), slow at 1005 (ready 1005+2+3600 = 4607): running at 4707.
    p = _isolate(_fleet(), FaultClass.NODE_CRASH, 3600.0)
    r = simulate_once(p, SEED, [ScriptedFault(1000.0, "quick", 1), ScriptedFault(1005.0, "slow", 0)])
    assert r.run_start.tolist() == [0.0, 4707.0]


def test_a_cold_spare_keeps_booting_through_a_second_fault() -> None:
    # Slow at 1000 (isolate 60): ready 1062, a cold spare is powered on and boots until 1062+1200 =
    # 2262. Quick at 1100 (ready 1110). The restart waits for the boot: running at 2262+100 = 2362.
    p = _isolate(_fleet(mode="cold"), FaultClass.NODE_CRASH, 60.0).with_changes(
        cold_start_seconds=1200.0)
    r = simulate_once(p, SEED, [ScriptedFault(1000.0, "slow", 0), ScriptedFault(1100.0, "quick", 1)])
    assert r.run_start.tolist() == [0.0, 2362.0]
    # One fault alone: 1062 + 1200 + 100.
    alone = simulate_once(p, SEED, [ScriptedFault(1000.0, "slow", 0)])
    assert alone.run_start.tolist() == [0.0, 2362.0]


def test_overlapping_faults_match_the_busy_period_closed_form() -> None:
    # Two classes at 0.005 per node-hour each on 100 nodes (L = 1 fault/h on the job), both
    # leaving the node in place: one takes 3,600 s to handle (as a human isolating), the other
    # 10 s; restart 100 s, checkpoints every 600 s taking 10 s. Waiting for every deadline makes
    # a down period an M/G/inf busy period with service D + R: ETTR = 0.5317 (D,
    # ettr_mixed_handling). Waiting for the latest fault only (the model before issue 18) would
    # give 0.5992, which the interval must exclude.
    nodes, per_node_hour = 100, 0.005
    cat = Catalog((fault("slow", "gpu-contained", "restart-job", per_node_hour / 8 * 1e6),
                   fault("quick", "fabric-flap", "restart-job", per_node_hour / 8 * 1e6)))
    p = resolve(stack(nodes=nodes, spares=0, interval_minutes=10, write_seconds=10,
                      detection={"gpu-contained": "active", "fabric-flap": "active"}), cat, days=200)
    h = dict(p.handling)
    h[FaultClass.GPU_CONTAINED] = dataclasses.replace(h[FaultClass.GPU_CONTAINED], detect_seconds=3600.0)
    h[FaultClass.FABRIC_FLAP] = dataclasses.replace(h[FaultClass.FABRIC_FLAP], detect_seconds=10.0)
    p = p.with_changes(handling=h, restart_seconds=100.0)
    est = mean_ci(ettr_values(p, run_replications(p, seed=4, runs=6, workers=1)))
    rate = 2 * per_node_hour / 3600.0
    every = ettr_mixed_handling(nodes, rate, [3600.0, 10.0], [0.5, 0.5], 100.0, 600.0, 10.0)
    latest = ettr_mixed_handling(nodes, rate, [3600.0, 10.0], [0.5, 0.5], 100.0, 600.0, 10.0,
                                 waits_for="latest")
    assert est.high - est.low < 0.02, est
    assert est.contains(every), (est, every)
    assert not est.contains(latest), (est, latest)
    # With one handling time both readings agree, and equal the renewal value.
    assert ettr_mixed_handling(nodes, rate, [50.0], [1.0], 100.0, 600.0, 10.0) == pytest.approx(
        ettr_mixed_handling(nodes, rate, [50.0], [1.0], 100.0, 600.0, 10.0, waits_for="latest"))
    assert ettr_mixed_handling(nodes, rate, [50.0], [1.0], 100.0, 600.0, 10.0) == pytest.approx(
        ettr_renewal(nodes, rate, 150.0, 600.0, 10.0))


def test_cold_spares_boot_side_by_side() -> None:
    # Nodes 0 and 1 crash at t=1000 (isolate 60 each): ready at 1062, both cold spares are powered
    # on at once and boot until 2262; restart 100: running at 2362 (one after the other would be
    # 1062 + 2 x 1200 + 100 = 3562).
    p = _isolate(_fleet(mode="cold"), FaultClass.NODE_CRASH, 60.0).with_changes(
        cold_start_seconds=1200.0)
    r = simulate_once(p, SEED, [ScriptedFault(1000.0, "slow", 0), ScriptedFault(1000.0, "slow", 1)])
    assert r.run_start.tolist() == [0.0, 2362.0]


# ---------------------------------------------------------------- checkpoint saves

def _one(length: float, cause: int, u: float | None = None, q: float = 0.0,
         store: StoreWindows | None = None, interval: float = 1000.0, write: float = 0.0) -> Accounting:
    return account(np.array([0.0]), np.array([length]), np.array([cause]), np.zeros(1), interval,
                   write, save_u=None if u is None else np.array([u]), fail_prob=q, store=store)


def test_failed_saves_lose_the_intervals_since_the_last_good_one() -> None:
    # 10,250 s of running with a save every 1,000 s: 10 saves. q = 0.5, u = 0.2: the trailing run
    # of failures is floor(ln 0.2 / ln 0.5) = floor(2.32) = 2, so the last good save is the 8th
    # (t = 8,000) and the fault loses 2,250 s instead of 250 s.
    a = _one(10_250.0, 0, u=0.2, q=0.5)
    assert (a.useful, a.lost_work) == (8000.0, 2250.0)
    assert _one(10_250.0, 0, u=0.2, q=0.0).lost_work == 250.0
    # At the horizon nothing is lost, failed saves or not.
    assert _one(10_250.0, -1, u=0.2, q=0.5).useful == 10_250.0


def test_failed_saves_match_the_geometric_expectation() -> None:
    # E[saves lost at the end of a run of d saves] = sum_{j=1..d} q^j (P(last j all failed) = q^j).
    rng = np.random.default_rng(0)
    n, d, q = 200_000, 5, 0.3
    u = rng.random(n)
    a = account(np.zeros(n), np.full(n, d * 1000.0 + 1.0), np.zeros(n, dtype=np.int64), np.zeros(1),
                1000.0, 0.0, save_u=u, fail_prob=q)
    expected = n * (1.0 + 1000.0 * sum(q**j for j in range(1, d + 1)))
    assert a.lost_work == pytest.approx(expected, rel=5e-3)


def test_failed_saves_retried_at_once() -> None:
    # q = 0.5, 2 retries: a save fails in the end with 0.5^3 = 0.125 and costs on average
    # 100 x (1 + 0.5 + 0.25) = 175 s. interval 1000: cycles of 1,175 s; 10,000 s of running hold 8
    # saves. u = 0.1: floor(ln 0.1 / ln 0.125) = floor(1.107) = 1 failed save at the end, so the
    # last good one is the 7th (8,225 s): useful 7,000, overhead 7 x 175, lost 1,775.
    w, q = save_costs(100.0, 0.5, 2)
    assert [w, q] == pytest.approx([175.0, 0.125])
    a = _one(10_000.0, 0, u=0.1, q=q, interval=1000.0, write=w)
    assert [a.useful, a.checkpoint_overhead, a.lost_work] == pytest.approx([7000.0, 1225.0, 1775.0])
    assert save_costs(100.0, 0.5, 0) == (100.0, 0.5) and save_costs(100.0, 0.0, 3) == (100.0, 0.0)


def test_a_save_cut_off_by_a_fault_is_lost_with_its_interval() -> None:
    # interval 1000, write 100: saves end at 1100 and 2200; a fault at 3150 hits the third
    # interval's training (2200-3200): lost 950.
    assert _one(3150.0, 0, interval=1000.0, write=100.0).lost_work == 950.0
    # A fault at 3250 cuts the third write (3200-3300): lost 1050, the partial write included.
    a = _one(3250.0, 0, interval=1000.0, write=100.0)
    assert (a.useful, a.checkpoint_overhead, a.lost_work) == (2000.0, 200.0, 1050.0)


# ---------------------------------------------------------------- the checkpoint store

def test_saves_fail_while_the_store_is_down() -> None:
    # Saves at 1000, 2000, ... (free writes). Store down [2500, 5500): the saves at 3000, 4000 and
    # 5000 fail. A fault at 5800 goes back to 2000 (loses 3800); one at 6200 to 6000 (loses 200).
    down = StoreWindows(np.array([2500.0]), np.array([5500.0]), np.array([0]), 5.0)
    assert _one(5800.0, 0, store=down).lost_work == 3800.0
    a = _one(6200.0, 0, store=down)
    assert (a.useful, a.lost_work) == (6000.0, 200.0)


def test_a_save_still_writing_when_the_store_goes_down_fails() -> None:
    # interval 1000, write 100; store down [1050, 3000): the first save (1000-1100) is cut off at
    # 1050, the second (2100) starts while the store is down: both fail; the third (3200-3300) is
    # good. A fault at 3150 loses everything (3150); one at 3400 loses 100 (since 3300).
    down = StoreWindows(np.array([1050.0]), np.array([3000.0]), np.array([0]), 5.0)
    a = _one(3150.0, 0, store=down, interval=1000.0, write=100.0)
    assert (a.useful, a.lost_work) == (0.0, 3150.0)
    a = _one(3400.0, 0, store=down, interval=1000.0, write=100.0)
    assert (a.useful, a.checkpoint_overhead, a.lost_work) == (3000.0, 300.0, 100.0)
    # The outage starting just after that write ended (1100) leaves the first save good.
    later = StoreWindows(np.array([1100.0]), np.array([3000.0]), np.array([0]), 5.0)
    assert _one(3150.0, 0, store=later, interval=1000.0, write=100.0).lost_work == 3150.0 - 1100.0


def test_saves_take_longer_while_the_store_is_degraded() -> None:
    # interval 1000, write 10; degraded x5 over [2500, 4500): saves end at 1010, 2020 (normal),
    # then the saves starting at 3020 and 4070 take 50 s (end 3070, 4120), then 5130 and 6140.
    slow = StoreWindows(np.array([2500.0]), np.array([4500.0]), np.array([1]), 5.0)
    a = _one(6200.0, 0, store=slow, interval=1000.0, write=10.0)
    assert a.useful == 6000.0
    assert a.checkpoint_overhead == pytest.approx(4 * 10.0 + 2 * 50.0)
    assert a.lost_work == pytest.approx(6200.0 - 6140.0)


def _store_fleet(nodes: int) -> SimParams:
    cat = Catalog((fault("st", "storage-outage", "none", 5.0, "store"),))
    return resolve(stack(nodes=nodes, spares=0), cat, days=365)


def test_store_faults_do_not_grow_with_the_node_count() -> None:
    # 5 per 1M GPU-h observed on a 16,384-GPU fleet: 5e-6 x 16,384 x 8,760 h = 717.6 a year, at
    # 8 nodes as at 512.
    expected = 5e-6 * 16_384 * 8760
    for nodes in (8, 512):
        p = _store_fleet(nodes)
        counts = [simulate_once(p, s).faults_by_kind[0] for s in replication_seeds(3, 8)]
        assert abs(np.mean(counts) - expected) < 3 * math.sqrt(expected / 8), (nodes, np.mean(counts))


def test_a_store_outage_does_not_stop_the_job_but_blocks_its_restart() -> None:
    # Store down 1 h from t=500 (no job interruption: action none). A node crash at t=1000 (ready
    # 1062) must wait for the store (back at 4100) before restarting: running again at 4200.
    cat = Catalog((fault("st", "storage-outage", "none", TINY, "store"),
                   fault("slow", "node-crash", "replace", TINY, "slow")))
    p = resolve(stack(nodes=4, spares=2, detection={"node-crash": "active"}), cat, days=1)
    p = _isolate(p, FaultClass.NODE_CRASH, 60.0).with_changes(restart_seconds=100.0,
                                                               breaker_max_share=1.0)
    assert p.handling[FaultClass.STORAGE_OUTAGE].domain_outage_hours == 1.0
    r = simulate_once(p, SEED, [ScriptedFault(500.0, "st"), ScriptedFault(1000.0, "slow", 0)])
    assert r.interruptions == 1
    assert r.run_start.tolist() == [0.0, 4200.0]
    assert (r.store_start.tolist(), r.store_end.tolist()) == ([500.0], [4100.0])


# ---------------------------------------------------------------- nodes and the ladder

def test_a_replaced_node_starts_fresh() -> None:
    from gpufleet.sim.engine import Replication

    p = _fleet(spares=2).with_changes(lemon_fraction=0.5, lemon_multiplier=10.0,
                                      recurrence_factor=2.0)
    m = Replication(p, SEED)
    lemon = int(np.argmax(m.base_mult))
    # 3 lemons of 6 at 10x, 3 at 1x: mean 5.5 -> lemons 10/5.5, the others 1/5.5.
    assert m.base_mult[lemon] == pytest.approx(10 / 5.5)
    m.inject([ScriptedFault(100.0, "quick", lemon), ScriptedFault(200.0, "slow", lemon)])
    m.env.run(until=150.0)
    assert m.failures[lemon] == 1 and m._mult(lemon) == pytest.approx(2 * 10 / 5.5)
    m.env.run(until=250.0)
    assert m.failures[lemon] == 0
    assert m._mult(lemon) == pytest.approx(1 / 5.5)  # a new machine: the ordinary rate


def test_in_cordon_mode_a_human_starts_the_repair() -> None:
    # remediation.mode cordon: the node is isolated automatically (60 s) but not rebooted by the
    # remediator. Node 0 (reset-gpu rung) at t=1000: detect 10, isolate 60, then a human (3,600 s)
    # and the reset (300 s): back at 1000 + 10 + 60 + 3600 + 300 = 4970 (at 1370 under
    # cordon-drain-remediate). The job does not wait for the human: it takes a warm spare.
    from gpufleet.sim.engine import Replication

    p = _isolate(_fleet(), FaultClass.GPU_DEGRADED, 60.0)
    for manual, back in ((True, 4970.0), (False, 1370.0)):
        m = Replication(p.with_changes(manual_remediation=manual), SEED)
        m.inject([ScriptedFault(1000.0, "reset", 0)])
        m.env.run(until=1001.0)
        assert m.return_at[0] == back
        r = m.run()
        assert r.run_start.tolist() == [0.0, 1170.0]  # 1000 + 10 + 60, warm spare, restart 100
    spec = stack(nodes=4, spares=2)
    cordon = spec.model_copy(update={"remediation": spec.remediation.model_copy(update={"mode": "cordon"})})
    cat = Catalog((fault("reset", "gpu-degraded", "reset-gpu", TINY, "reset"),))
    assert resolve(cordon, cat, days=1).manual_remediation
    assert not resolve(spec, cat, days=1).manual_remediation


def test_the_breaker_threshold_is_rounded_as_nvsentinel_rounds_it() -> None:
    # 6 nodes at 5%: ceil(6 x 5 / 100) = 1 quarantine per window (gpufleet.core.breaker). Node 0
    # at t=1000 is quarantined by the remediator: back at 1000 + 10 + 60 + 300 (reset) = 1370.
    # Node 1 at t=1100, within the 5-minute window, is refused: a human isolates it (3,600 s),
    # back at 1100 + 10 + 3600 + 300 = 5010.
    from gpufleet.sim.engine import Replication

    p = _isolate(_fleet(), FaultClass.GPU_DEGRADED, 60.0).with_changes(breaker_max_share=0.05)
    m = Replication(p, SEED)
    assert m.breaker_threshold == 1
    m.inject([ScriptedFault(1000.0, "reset", 0), ScriptedFault(1100.0, "reset", 1)])
    m.env.run(until=1101.0)
    assert (m.return_at[0], m.return_at[1], m.breaker_trips) == (1370.0, 5010.0, 1)


def _ladder_after(p: SimParams, times_h: list[float]) -> list[str]:
    from gpufleet.sim.engine import Replication

    m = Replication(p, SEED)
    k = m.kind_index["reset"]
    out = []
    for t in times_h:
        m.env.run(until=t * 3600.0)
        out.append(m._ladder(0, k).value)
    return out


def test_attempt_caps_count_since_the_node_was_new_by_default() -> None:
    p = _fleet().with_changes(days=10, cap_reset_gpu=2, cap_reboot_node=1)
    # resets 2 (cap), then a reboot (cap 1), then replace, which starts the count again.
    assert _ladder_after(p, [1, 2, 30, 60, 100, 101]) == [
        "reset-gpu", "reset-gpu", "reboot-node", "replace", "reset-gpu", "reset-gpu"]


def test_attempt_caps_over_a_time_window() -> None:
    p = _fleet().with_changes(days=10, cap_reset_gpu=2, cap_reboot_node=1,
                              attempt_window_seconds=24 * 3600.0)
    # Within 24 h the third reset becomes a reboot; at 30 h the resets at 1 h and 2 h have left
    # the window, so it is a reset again.
    assert _ladder_after(p, [1, 2, 3, 30]) == ["reset-gpu", "reset-gpu", "reboot-node", "reset-gpu"]
    # A configured cap of 0 means never: every reset climbs to a reboot.
    assert _ladder_after(p.with_changes(cap_reset_gpu=0), [1])[0] == "reboot-node"


# ---------------------------------------------------------------- drains (upgrade waves)

def test_a_fault_during_an_upgrade_wave_waits_for_the_drained_spare() -> None:
    # 4 job nodes and 1 warm spare; the wave (1 node, 1 h) starts at t=1000 with the spare, so
    # the spare is out until 4600. Node 0 crashes at 1500 (ready 1562): no spare is left, so the
    # job waits for the drained one and restarts at 4600: running at 4700.
    p = _isolate(_fleet(spares=1), FaultClass.NODE_CRASH, 60.0).with_changes(
        upgrade=UpgradeWave(start_seconds=1000.0, wave_nodes=1, wave_seconds=3600.0),
        days=8000 / 86400)  # the second wave (4600) meets node 0 under repair; the third is at 8200
    r = simulate_once(p, SEED, [ScriptedFault(1500.0, "slow", 0)])
    assert r.run_start.tolist()[:2] == [0.0, 4700.0]
    assert r.spares_exhausted
    assert r.wait_for_nodes_seconds == pytest.approx(4600.0 - 1562.0)
    # Without the wave the spare is there at 1562: running at 1662.
    calm = simulate_once(p.with_changes(upgrade=None), SEED, [ScriptedFault(1500.0, "slow", 0)])
    assert calm.run_start.tolist() == [0.0, 1662.0]


def test_a_wave_that_takes_a_job_node_is_a_planned_restart_without_lost_work() -> None:
    # No spares: the first wave (t=1000) takes node 0 for 1 h. The job stops at 1000 with its work
    # saved (cause -2), waits for node 0 (back at 4600), restarts (100 s): running at 4700.
    p = _fleet(spares=0).with_changes(
        upgrade=UpgradeWave(start_seconds=1000.0, wave_nodes=1, wave_seconds=3600.0), days=4600 / 86400)
    r = simulate_once(p, SEED)
    assert r.run_cause.tolist()[0] == -2 and r.interruptions == 0
    assert r.planned_down_seconds == pytest.approx(3600.0)
    a = account(r.run_start, r.run_end, r.run_cause, r.down_seconds_by_kind, 300.0, 0.0)
    assert a.lost_work == 0.0 and a.useful == 1000.0
