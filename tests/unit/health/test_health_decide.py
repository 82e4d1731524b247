"""node-health decisions as table tests over observations (no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.catalog import OverrideSpec, load_catalog, xid_policy
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.health.decide import drain_argv, drain_reason, evaluate
from gpufleet.health.observe import GpuReading, LinkReading, Observations, XidSeen

CAT = load_catalog()
TABLE, _ = xid_policy(CAT, {})
NOW = 1_000_000.0
GPUS = tuple(GpuReading(i) for i in range(8))
UP = (LinkReading("fab0", True, "up"),)


def obs(xids: list[tuple[int, int, float]] = (), **kw: object) -> Observations:  # type: ignore[assignment]
    base = Observations("gpu-1", NOW, GPUS, tuple(XidSeen(g, x, NOW - ago) for g, x, ago in xids), UP)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "observation", "status", "fault_ids"),
    [
        ("healthy", obs(), "ok", []),
        ("xid 79 drains", obs([(3, 79, 5)]), "problem", ["gpu-xid-79"]),
        ("xid 45 burst after 79 is an echo", obs([(3, 79, 5)] + [(3, 45, 4)] * 20), "problem",
         ["gpu-xid-79"]),
        ("xid 45 alone never drains", obs([(2, 45, 4)] * 20), "ok", ["gpu-xid-45"]),
        ("repeats of 79 within the window count once", obs([(3, 79, 5), (3, 79, 5), (3, 79, 60)]),
         "problem", ["gpu-xid-79"]),
        ("no GPU source is unknown, never healthy", obs(gpus=None), "unknown", []),
        ("a fault beats an unknown source", obs([(3, 79, 5)], links=None), "problem", ["gpu-xid-79"]),
        ("fabric port down", obs(links=(LinkReading("fab0", False, "lowerlayerdown"),)), "problem",
         ["fabric-port-down"]),
        ("unknown link state", obs(links=None), "unknown", []),
        ("unknown xid warns only", obs([(1, 254, 5)]), "ok", [None]),
    ],
)
def test_verdict_table(
    name: str, observation: Observations, status: str, fault_ids: list[str | None]
) -> None:
    v = evaluate(observation, CAT, TABLE)
    assert v.status == status, (name, v.message)
    assert [f.fault_id for f in v.findings] == fault_ids, name
    assert v.exit_code == {"ok": 0, "problem": 1, "unknown": 2}[status]
    assert "\n" not in v.message


def test_reset_clears_current_faults_but_not_history() -> None:
    # XID 79 on GPU 3, then the node was power-cycled (agent /clear): healthy again.
    gpus = tuple(GpuReading(i, reset_at=NOW - 10) for i in range(8))
    assert evaluate(obs([(3, 79, 100)], gpus=gpus), CAT, TABLE).status == "ok"
    # A new XID 79 right after the reboot is a new fault (not a duplicate of the old one) and, being
    # the second in the escalation window, escalates to replace.
    v = evaluate(obs([(3, 79, 100), (3, 79, 5)], gpus=gpus), CAT, TABLE)
    assert v.status == "problem"
    (f,) = v.findings
    fault = CAT.get("gpu-xid-79")
    assert fault.escalation is not None
    assert f.action is fault.escalation.to and "escalated: 2" in f.detail


def test_a_gpu_reset_remedies_what_escalates_to_a_reset() -> None:
    # XID 94 escalates to reset-gpu on its 2nd occurrence in 24 h. Two in a row without a reset
    # between them: reset the GPU (drain). The same two with a GPU reset between them: the reset
    # remedied the first, so the second is judged on its own (restart the job, keep the node).
    fault = CAT.get("gpu-xid-94")
    assert fault.escalation is not None and fault.escalation.to is LadderAction.RESET_GPU
    v = evaluate(obs([(0, 94, 700), (0, 94, 5)]), CAT, TABLE)
    assert v.status == "problem" and "escalated: 2" in v.findings[-1].detail
    reset = tuple(GpuReading(i, reset_at=NOW - 600) for i in range(8))
    v = evaluate(obs([(0, 94, 700), (0, 94, 5)], gpus=reset), CAT, TABLE)
    assert v.status == "ok" and v.findings[-1].action is LadderAction.RESTART_JOB


def test_stack_override_changes_the_action() -> None:
    table, problems = xid_policy(CAT, {45: OverrideSpec(LadderAction.RESET_GPU, "strict site",
                                                         FaultClass.GPU_FATAL)})
    assert problems == []
    v = evaluate(obs([(2, 45, 3)]), CAT, table)
    assert v.status == "problem" and v.findings[0].action is LadderAction.RESET_GPU


def test_drain_names_the_fault_and_gpu() -> None:
    v = evaluate(obs([(3, 79, 5)], links=(LinkReading("fab0", False, "down"),)), CAT, TABLE)
    target = v.drain
    assert target is not None and target.fault_id == "gpu-xid-79"  # dated GPU fault first at equal rank
    assert drain_reason(target) == "gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 3)"
    assert drain_argv("/usr/bin/scontrol", "gpu-1", target) == [
        "/usr/bin/scontrol", "update", "nodename=gpu-1", "state=drain",
        "reason=gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 3)"]
    assert evaluate(obs([(2, 45, 3)]), CAT, TABLE).drain is None  # non-isolating: never drained


def test_every_isolating_catalog_xid_is_a_problem_and_others_are_not() -> None:
    for xid, rule in TABLE.items():
        v = evaluate(obs([(0, xid, 1)]), CAT, TABLE)
        assert (v.status == "problem") == rule.action.isolates_node, xid
