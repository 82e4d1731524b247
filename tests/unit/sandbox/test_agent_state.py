"""Pure parts of the node agent: field table, injection semantics, fatal decisions from the catalog,
clears, persistence, the gpu-health document and the kernel-log line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet.catalog import OverrideSpec, load_catalog, xid_policy
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sandbox.agent import fields as F
from gpufleet.sandbox.agent.kmsg import xid_line
from gpufleet.sandbox.agent.policy import classify_field, classify_xid, is_fatal
from gpufleet.sandbox.agent.state import (
    Injection,
    clear,
    from_json,
    health_doc,
    initial_state,
    inject,
    parse_injection,
    to_json,
)

CAT = load_catalog()
RULES = xid_policy(CAT, {})[0]


def test_field_table_ids_and_names_follow_dcgm() -> None:
    # Ids from dcgm_fields.h as listed in gpu-faults.md; names are DCGM_FI_DEV_<field>.
    expected = {230: "XID_ERRORS", 150: "GPU_TEMP", 155: "POWER_USAGE", 202: "PCIE_REPLAY_COUNTER",
                310: "ECC_SBE_VOL_TOTAL", 311: "ECC_DBE_VOL_TOTAL", 393: "UNCORRECTABLE_REMAPPED_ROWS",
                394: "CORRECTABLE_REMAPPED_ROWS", 395: "ROW_REMAP_FAILURE", 396: "ROW_REMAP_PENDING",
                409: "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 240: "POWER_VIOLATION", 241: "THERMAL_VIOLATION"}
    for fid, suffix in expected.items():
        assert F.FIELDS[fid].metric == f"DCGM_FI_DEV_{suffix}"
    assert F.FIELDS[230].kind == "gauge"  # last XID, dcgm-exporter #190
    assert F.FIELDS[311].kind == "counter"
    with pytest.raises(ValueError, match="not published"):
        F.field_spec(9999)


def test_pci_and_uuid_formats() -> None:
    assert F.pci_bus_id(0) == "0000:18:00"
    assert F.pci_bus_id(3) == "0000:5d:00"
    assert len({F.pci_bus_id(i) for i in range(16)}) == 16
    u = F.gpu_uuid("gpu-0", 3)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u)
    assert u == F.gpu_uuid("gpu-0", 3) != F.gpu_uuid("gpu-1", 3)


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        ({"gpu": 8, "field_id": 230, "value": 79}, "gpu must be"),
        ({"gpu": 0, "field_id": 12345, "value": 1}, "not published"),
        ({"gpu": 0, "field_id": 230, "value": "79"}, "value must be a number"),
        ({"gpu": 0, "field_id": 230, "value": 79.5}, "integer 0..255"),
        ({"gpu": 0, "field_id": 150, "value": 90, "kmsg": True}, "XIDs only"),
        ({"gpu": 0, "field_id": 230, "value": 45, "burst": 0}, "burst"),
        ({"gpu": 0, "field_id": 230, "value": 45, "extra": 1}, "unknown keys"),
        ({"gpu": True, "field_id": 230, "value": 45}, "gpu must be"),
        ([1, 2], "JSON object"),
    ],
)
def test_parse_injection_rejects_bad_bodies(body: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_injection(body, 8)


def test_xid_injection_sets_gauge_counts_and_marks_fatal_from_catalog() -> None:
    s0 = initial_state("gpu-0", 8, now=100.0)
    inj = parse_injection({"gpu": 3, "field_id": 230, "value": 79, "kmsg": True}, 8)
    s1, ev = inject(s0, inj, CAT, RULES, 101.0)
    g = s1.gpus[3]
    assert g.fields[230] == 79
    assert g.xid_counts == {79: 1}
    assert [(e.gpu, e.xid, e.at) for e in ev] == [(3, 79, 101.0)]
    assert g.fault is not None and g.fault.fatal and g.fault.fault_id == "gpu-xid-79"
    assert g.fault_since == 101.0
    assert s0.gpus[3].fields == {}  # pure: the old state is untouched
    # An XID 45 burst afterwards: gauge shows 45 (last XID), counts add up, the GPU stays dead.
    s2, ev2 = inject(s1, Injection(3, 230, 45, kmsg=True, burst=20), CAT, RULES, 102.0)
    g2 = s2.gpus[3]
    assert g2.fields[230] == 45
    assert g2.xid_counts == {79: 1, 45: 20}
    assert len(ev2) == 20 and len(s2.events) == 21
    assert g2.fault is not None and g2.fault.xid == 79 and g2.fault_since == 101.0


def test_fatal_follows_the_catalog_not_a_list() -> None:
    for fault in CAT:
        if fault.xid is not None:
            assert classify_xid(fault.xid, CAT, RULES).fatal == is_fatal(fault), fault.id
    assert classify_xid(79, CAT, RULES).fatal
    assert not classify_xid(45, CAT, RULES).fatal  # action none, no DCGM FAIL
    unknown = next(x for x in range(1, 256) if x not in CAT.by_xid())
    v = classify_xid(unknown, CAT, RULES)
    assert not v.fatal and v.fault_id is None


def test_the_stacks_xid_overrides_decide_what_kills_the_job() -> None:
    """remediation.xidOverrides reach the node agent: an XID the stack isolates on is fatal, and an
    XID only the stack knows is classified by the stack's class."""
    unknown = next(x for x in range(1, 256) if x not in CAT.by_xid())
    rules, problems = xid_policy(CAT, {
        13: OverrideSpec(LadderAction.RESET_GPU, "XID 13 precedes a dead GPU here", FaultClass.GPU_FATAL),
        unknown: OverrideSpec(LadderAction.RESTART_JOB, "vendor note", FaultClass.GPU_CONTAINED),
    })
    assert problems == []
    assert not classify_xid(13, CAT, RULES).fatal and classify_xid(13, CAT, rules).fatal
    v = classify_xid(unknown, CAT, rules)
    assert not v.fatal and v.kills_process


def test_the_agent_command_line_reads_a_stack_files_overrides(tmp_path: Path) -> None:
    from gpufleet.catalog.policy import parse_overrides
    from gpufleet.sandbox.agent.cli import main

    got = parse_overrides('{"13": {"action": "reset-gpu", "reason": "r", "faultClass": "gpu-fatal"}}', "x")
    assert got == {13: OverrideSpec(LadderAction.RESET_GPU, "r", FaultClass.GPU_FATAL)}
    with pytest.raises(ValueError, match="--xid-overrides"):
        parse_overrides('{"13": {"action": "explode"}}', "--xid-overrides")
    # A conflicting table (a fatal class with an action that keeps the node) stops the agent: exit 2.
    token = tmp_path / "token"
    token.write_text("t\n")
    bad = '{"79": {"action": "restart-job", "reason": "r"}}'
    assert main(["--node", "n", "--listen", "127.0.0.1:1", "--control-socket", str(tmp_path / "s"),
                 "--token-file", str(token), "--state-dir", str(tmp_path), "--kernel-log",
                 str(tmp_path / "k"), "--xid-overrides", bad]) == 2


def test_non_fatal_xid_does_not_write_a_fatal_health_entry() -> None:
    s, _ = inject(initial_state("n", 2, 0.0), Injection(1, 230, 45, burst=3), CAT, RULES, 1.0)
    doc = health_doc(s)
    assert doc["gpus"]["1"]["fatal"] is False
    assert "0" not in doc["gpus"]


def test_field_injection_sets_value_like_dcgm_and_uses_dcgm_field_checks() -> None:
    s, ev = inject(initial_state("n", 2, 0.0), Injection(0, F.ECC_SBE_VOL_TOTAL, 5), CAT, RULES, 1.0)
    s, _ = inject(s, Injection(0, F.ECC_SBE_VOL_TOTAL, 7), CAT, RULES, 2.0)
    assert s.gpus[0].fields[F.ECC_SBE_VOL_TOTAL] == 7  # set, not added (dcgmi test --inject)
    assert ev == []
    # Whatever the catalog says about a field, the verdict equals its dcgm-field checks.
    for fault in CAT:
        hc = fault.health_check
        if hc is not None and hc.source == "dcgm-field" and hc.field_id in F.FIELDS:
            assert hc.threshold is not None
            v = classify_field(hc.field_id, hc.threshold + 1, CAT)
            assert v is not None and v.fatal == is_fatal(CAT.get(v.fault_id or ""))
    checked = {f.health_check.field_id for f in CAT
               if f.health_check and f.health_check.source == "dcgm-field"}
    for fid in set(F.FIELDS) - checked - {F.XID_ERRORS}:
        assert classify_field(fid, 1e9, CAT) is None, fid


def test_clear_one_gpu_and_all() -> None:
    s, _ = inject(initial_state("n", 4, 0.0), Injection(1, 230, 79, kmsg=True), CAT, RULES, 1.0)
    s, _ = inject(s, Injection(2, 230, 48), CAT, RULES, 2.0)
    one = clear(s, 1, 3.0)
    assert one.gpus[1].fault is None and one.gpus[1].xid_counts == {} and one.gpus[1].reset_at == 3.0
    assert one.gpus[2].fault is not None and one.gpus[2].reset_at is None
    assert {e.gpu for e in one.events} == {2}
    everything = clear(s, None, 4.0)
    assert all(g.fault is None and g.fields == {} and g.reset_at == 4.0 for g in everything.gpus)
    assert everything.events == () and health_doc(everything)["gpus"] == {}


def test_persistence_round_trip_and_node_check() -> None:
    s, _ = inject(initial_state("gpu-2", 8, 5.0), Injection(3, 230, 79, kmsg=True), CAT, RULES, 6.0)
    s, _ = inject(s, Injection(5, F.ECC_SBE_VOL_TOTAL, 12), CAT, RULES, 7.0)
    back = from_json(to_json(s), "gpu-2", 8, 99.0)
    assert back == s
    with pytest.raises(ValueError, match="belongs to node"):
        from_json(to_json(s), "gpu-3", 8, 99.0)
    fewer = from_json(to_json(s), "gpu-2", 4, 99.0)
    assert len(fewer.gpus) == 4 and fewer.gpus[3].fault is not None


def test_health_doc_matches_the_rank_contract() -> None:
    s, _ = inject(initial_state("n", 8, 0.0), Injection(3, 230, 79), CAT, RULES, 1234.5)
    entry = health_doc(s)["gpus"]["3"]
    assert entry == {
        "fatal": True, "kills_process": True, "xid": 79, "fault_id": "gpu-xid-79", "since": 1234.5,
        "error": "CUDA error: unspecified launch failure (Xid 79: GPU has fallen off the bus)",
    }


def test_kernel_log_line_has_the_driver_format() -> None:
    line = xid_line(host="gpu-1", at=0.0, uptime=12.5, pci="0000:5d:00", xid=79, pid=4242, proc="python",
                    text="GPU has fallen off the bus.")
    assert line == ("1970-01-01T00:00:00.000000+00:00 gpu-1 kernel: [   12.500000] NVRM: Xid "
                    "(PCI:0000:5d:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n")
    anon = xid_line(host="h", at=0.0, uptime=0, pci="0000:18:00", xid=45, pid=None, proc=None, text="x")
    assert "pid='<unknown>', name=<unknown>, x" in anon


def test_contained_faults_kill_only_the_process_running_at_the_time() -> None:
    """XID 94 (contained ECC, action restart-job): the running rank fails, a restarted one runs and
    the node stays in service; XID 79 (fatal) fails every process; XID 45 (action none) fails none."""
    from gpufleet.sandbox.agent.policy import classify_xid
    from gpufleet.sandbox.agent.state import health_doc
    from gpufleet.sandbox.gpu_health import gpu_fault

    cat = load_catalog()
    x94, x79, x45 = (classify_xid(x, cat, xid_policy(cat, {})[0]) for x in (94, 79, 45))
    assert (x94.fatal, x94.kills_process) == (False, True)
    assert (x79.fatal, x79.kills_process) == (True, True)
    assert (x45.fatal, x45.kills_process) == (False, False)
    s, _ = inject(initial_state("gpu-0", 2, 0.0), Injection(0, 230, 94), cat, RULES, 100.0)
    doc = health_doc(s)
    assert doc["gpus"]["0"]["kills_process"] is True and doc["gpus"]["0"]["since"] == 100.0
    assert gpu_fault(doc, 0, started_at=50.0) is not None  # running when it happened: dies
    assert "Xid 94" in (gpu_fault(doc, 0, started_at=50.0) or "")
    assert gpu_fault(doc, 0, started_at=101.0) is None  # the restarted rank runs
    assert gpu_fault(doc, 1, started_at=50.0) is None  # another GPU
    assert gpu_fault(doc, 0) is None  # no start time known: only fatal faults apply
    s, _ = inject(s, Injection(1, 230, 79), cat, RULES, 200.0)
    assert gpu_fault(health_doc(s), 1, started_at=300.0) is not None  # fatal: every process
    # Persisted and restored with the flag.
    assert from_json(to_json(s), "gpu-0", 2, 0.0).gpus[0].fault == s.gpus[0].fault
