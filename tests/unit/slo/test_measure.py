from __future__ import annotations

from collections.abc import Callable

from gpufleet.slo import Event, EventKind, Timeline, measure

Load = Callable[[str], Timeline]


def test_recovered_fatal_fault_times_are_from_injection(recorded: Load) -> None:
    m = measure(recorded("gpu_fatal_recovered"))
    assert m.injected_at == 1010.0
    assert m.time_to_detect == 3.5
    assert m.time_to_isolate == 4.25
    assert m.time_to_recover == 31.0
    assert m.time_to_return == 91.5
    assert m.lost_steps == 12
    assert m.recovered is True
    assert m.interrupted is True
    assert m.availability == 1.0 - 87.25 / 600.0
    assert m.notes == ()


def test_never_recovered(recorded: Load) -> None:
    m = measure(recorded("never_recovered"))
    assert m.recovered is False
    assert m.interrupted is True
    assert m.time_to_recover is None
    assert m.time_to_detect == 17.0
    assert m.time_to_isolate == 17.0
    assert m.time_to_return is None
    assert m.lost_steps is None  # never resumed: no resumed_from_step
    # An interval still open at the window's end counts until the end.
    assert m.availability == 1.0 - 153.0 / 900.0
    assert m.notes == ("the workload never resumed within the window (observed 170.0 s after the fault)",)


def test_recovered_before_detection_gives_no_negative_time(recorded: Load) -> None:
    m = measure(recorded("recovered_before_detection"))
    assert m.time_to_recover == 3.0
    assert m.time_to_detect == 8.0
    assert m.time_to_isolate is None
    assert m.recovered is True
    assert m.lost_steps == 0
    assert m.availability == 1.0
    assert m.notes == (
        "the workload resumed 5.0 s before the fault was detected: the fault did not interrupt "
        "training long enough to be noticed first",
    )


def test_overlapping_faults_measure_from_the_first_injection(recorded: Load) -> None:
    m = measure(recorded("overlapping_faults"))
    assert m.injected_at == 4010.0
    assert m.time_to_detect == 16.5
    assert m.time_to_isolate == 16.5
    # The resume at 3995 (before the injection) is ignored; the one after the fault counts.
    assert m.time_to_recover == 65.0
    assert m.time_to_return == 140.0
    assert m.lost_steps == 0
    # gpu-0's two overlapping intervals count once: 4026.5-4150 = 123.5 s; gpu-1 open: 169 s.
    assert m.availability == 1.0 - (123.5 + 169.0) / 1000.0
    assert m.notes == (
        "2 injections in one timeline (overlapping faults; others at +5.0 s): every time is measured "
        "from the first injection",
        "2 event(s) before the injection ignored (detected, resumed)",
    )


def test_missing_sources_are_none_not_zero(recorded: Load) -> None:
    m = measure(recorded("missing_sources"))
    assert (m.time_to_detect, m.time_to_isolate, m.time_to_recover, m.time_to_return) == (None,) * 4
    assert m.lost_steps is None
    assert m.availability is None
    assert m.interrupted is None
    assert m.recovered is False
    assert m.notes == (
        "node count unknown (no scheduler source): availability unknown",
        "no workload source (no step facts, no stall or resume event): recovery unknown",
        "no detection event after the injection",
    )


def test_fault_that_did_not_interrupt(recorded: Load) -> None:
    m = measure(recorded("not_interrupted"))
    assert m.interrupted is False
    assert m.recovered is False
    assert m.time_to_recover is None
    assert m.time_to_detect == 12.75
    assert m.availability == 1.0
    assert m.notes == ("the workload was not interrupted by the fault (no stall, no restart)",)


def test_no_injection_measures_nothing(recorded: Load) -> None:
    m = measure(recorded("no_injection"))
    assert m.injected_at is None
    assert (m.time_to_detect, m.time_to_recover) == (None, None)
    assert m.availability == 1.0
    assert m.notes == ("no injection event: nothing can be measured (was the fault ledger read?)",)


def test_resume_from_after_the_fault_step_is_flagged(recorded: Load) -> None:
    m = measure(recorded("contained_isolated"))
    assert m.lost_steps is None
    assert m.notes == (
        "resumed from step 60, after the last step before the fault (50): step facts inconsistent, "
        "lost work unknown",
    )


def test_resume_before_the_stall_does_not_count() -> None:
    t = Timeline(
        experiment="x", fault_id="xid-79", fault_class="gpu-fatal", window_start=0.0, window_end=100.0,
        steps_at_fault=5,
        events=[
            Event(kind=EventKind.INJECTED, at=10.0, source="ledger"),
            Event(kind=EventKind.RESUMED, at=11.0, source="workload"),
            Event(kind=EventKind.INTERRUPTED, at=12.0, source="workload"),
            Event(kind=EventKind.RESUMED, at=40.0, source="workload"),
        ],
    )
    assert measure(t).time_to_recover == 30.0


def test_return_counts_only_after_isolation() -> None:
    t = Timeline(
        experiment="x", fault_id="node-crash", fault_class="node-crash", window_start=0.0, window_end=100.0,
        events=[
            Event(kind=EventKind.INJECTED, at=10.0, source="ledger"),
            Event(kind=EventKind.RETURNED, at=12.0, source="slurm:gpu-0"),
            Event(kind=EventKind.ISOLATED, at=20.0, source="slurm:gpu-0"),
            Event(kind=EventKind.RETURNED, at=70.0, source="slurm:gpu-0"),
        ],
    )
    m = measure(t)
    assert m.time_to_return == 60.0
    assert m.time_to_isolate == 10.0


def test_bad_availability_input_is_a_note_not_a_crash() -> None:
    t = Timeline(
        experiment="x", fault_id="f", fault_class="node-crash", window_start=0.0, window_end=10.0,
        nodes_total=1, nodes_unavailable={"a": [(1.0, 2.0)], "b": [(1.0, 2.0)]},
        events=[Event(kind=EventKind.INJECTED, at=1.0, source="ledger")],
    )
    m = measure(t)
    assert m.availability is None
    assert m.notes[0] == "availability unknown: 2 nodes were unavailable but the cluster has only 1"


def test_measurement_to_dict_is_json_ready(recorded: Load) -> None:
    d = measure(recorded("never_recovered")).to_dict()
    assert d["time_to_recover"] is None
    assert d["recovered"] is False
    assert isinstance(d["notes"], list)
