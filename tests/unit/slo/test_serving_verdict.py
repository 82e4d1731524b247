"""The serving part of the one judge: a run's load records and its timeline -> serving checks in
the same verdict as detect / isolate / recover, and the balancer's view as node states."""

from __future__ import annotations

import pytest

from gpufleet.chaos.selectors import ServingNode, parse_node_selector
from gpufleet.core.haproxy_stats import replica_states
from gpufleet.slo import Budget, Event, EventKind, Outcome, RunInputs, RunVerdict, Timeline, judge_run
from gpufleet.slo.run import fault_window
from gpufleet.slo.serving import RequestRecord, ServingRun, ServingTargets, bin_records

T0 = 1_000_000.0
BUDGETS = {"gpu-fatal": Budget(15.0, 15.0, 60.0)}


def _timeline(inject: float, revert: float | None) -> Timeline:
    events = [
        Event(kind=EventKind.INJECTED, at=inject, source="ledger", node="srv-0"),
        Event(kind=EventKind.DETECTED, at=inject + 2, source="prometheus:GpuFallenOffBus"),
        Event(kind=EventKind.ISOLATED, at=inject + 1, source="scheduler", node="srv-0"),
    ]
    if revert is not None:
        events.append(Event(kind=EventKind.REVERTED, at=revert, source="ledger", node="srv-0"))
    return Timeline(experiment="x", fault_id="gpu-xid-79", fault_class="gpu-fatal", window_start=T0,
                    window_end=T0 + 60, events=events, steps_at_fault=85, checkpoint_step_at_fault=80,
                    nodes_total=7)


def _load(seconds: int, rate: int, bad: set[int]) -> ServingRun:
    """`rate` requests due per second for `seconds` s; every request of the seconds in `bad` fails."""
    records = [RequestRecord(T0 + s + i / rate, 0.02 + 0.001 * i, s not in bad)
               for s in range(seconds) for i in range(rate)]
    return ServingRun(bin_records(records, T0), ServingTargets(0.999, 500, 10), "http://10.76.0.1:8080")


def _judge(run: ServingRun, tl: Timeline | None) -> RunVerdict:
    return judge_run(RunInputs(timeline=tl, budgets=BUDGETS,
                               expect_isolation=True, expect_interruption=False, serving=run))


def test_a_short_outage_inside_the_fault_window_is_judged_request_by_request() -> None:
    v = _judge(_load(40, 40, {10}), _timeline(T0 + 10.2, T0 + 20))
    checks = {c.name: c for c in v.checks}
    assert checks["serving-availability"].outcome is Outcome.FAIL  # 40 of 1,600 failed: 97.5% < 99.9%
    assert checks["serving-availability"].measured == pytest.approx(1 - 40 / 1600)
    assert checks["serving-window-availability"].outcome is Outcome.FAIL  # 40 of 440 in [10, 20]
    assert checks["serving-window-p99-ms"].outcome is Outcome.PASS
    assert checks["serving-recover-s"].outcome is Outcome.PASS  # second 11 is clean: 0.8 s after
    assert checks["serving-recover-s"].measured == pytest.approx(0.8)
    assert checks["detect"].outcome is Outcome.PASS and checks["isolate"].outcome is Outcome.PASS
    assert v.outcome is Outcome.FAIL
    assert v.serving is not None and v.serving.fault == (T0 + 10.2, T0 + 20)
    assert v.serving.figures["failed"] == v.serving.figures["window_failed"] == 40
    assert v.serving.figures["budget_burnt"] == pytest.approx(40 / (1600 * 0.001))
    assert [s.due - s.ok for s in v.serving.seconds] == [40 if s == 10 else 0 for s in range(40)]
    # the verdict with its serving part survives the journal (to_doc / from_doc)
    assert RunVerdict.from_doc(v.to_doc()) == v


def test_no_failed_request_passes_every_serving_check() -> None:
    v = _judge(_load(30, 20, set()), _timeline(T0 + 5, T0 + 15))
    assert {c.name: c.outcome for c in v.checks if c.name.startswith("serving")} == {
        "serving-availability": Outcome.PASS, "serving-window-availability": Outcome.PASS,
        "serving-window-p99-ms": Outcome.PASS, "serving-recover-s": Outcome.PASS}
    assert v.outcome is Outcome.PASS


def test_without_targets_or_requests_the_serving_check_is_unknown_never_a_pass() -> None:
    run = _load(10, 10, set())
    no_targets = ServingRun(run.bins, None, run.url)
    v = _judge(no_targets, _timeline(T0 + 2, T0 + 5))
    assert [c.outcome for c in v.checks if c.name == "serving"] == [Outcome.UNKNOWN]
    assert v.outcome is Outcome.UNKNOWN and v.serving is not None and v.serving.figures["due"] == 100
    assert v.serving.figures["budget_burnt"] is None  # needs a target
    empty = _judge(ServingRun({}, ServingTargets(0.999, 500, 10)), _timeline(T0, T0 + 1))
    assert [c.detail for c in empty.checks if c.name == "serving"] == ["the load recorded no request"]
    assert empty.outcome is Outcome.UNKNOWN


def test_fault_window_runs_from_injection_to_revert_within_the_load() -> None:
    span = (T0, T0 + 40)
    assert fault_window(_timeline(T0 + 10, T0 + 20), span) == (T0 + 10, T0 + 20)
    assert fault_window(_timeline(T0 + 10, None), span) == (T0 + 10, T0 + 40)  # not reverted in time
    assert fault_window(_timeline(T0 + 10, T0 + 90), span) == (T0 + 10, T0 + 40)
    assert fault_window(None, span) == span


def test_the_balancers_view_is_the_serving_nodes_state() -> None:
    states = {"srv-0": "DOWN", "srv-1": "UP 1/3", "srv-2": "no check"}
    got = replica_states(states, ("srv-0", "srv-1", "srv-2", "srv-3"))
    assert {n: o.schedulable for n, o in got.items()} == {"srv-0": False, "srv-1": True, "srv-2": True,
                                                          "srv-3": False}
    assert got["srv-0"].reason == "out of the balancer's rotation (DOWN)"
    assert got["srv-3"].reason == "not in the balancer's backend replicas"
    unreadable = replica_states({}, ("srv-0",))
    assert not unreadable["srv-0"].schedulable and "unreadable" in unreadable["srv-0"].reason


def test_serving_selector() -> None:
    assert parse_node_selector("@serving:1") == ServingNode(1)
    with pytest.raises(ValueError, match="@serving:<index>"):
        parse_node_selector("@serving:x")
