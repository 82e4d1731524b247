"""The storage doctor's decisions, `gpufleet drill` on bad input and reading a verdict back from a
journal, and `sandbox down --storage` from a state file whose daemons are gone."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.drill_cmds import VERDICT_PROBE, verdict_from_journal
from gpufleet.cli.main import app
from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.core.storage_contract import StorageSandboxState, storage_state_path, write_storage_state
from gpufleet.sandbox.storage.ceph import storage_down
from gpufleet.sandbox.storage.doctor import ceph_major, diagnose_storage
from gpufleet.slo.dr import DrillInputs, DrTargets, RestoredCheckpoint, judge_drill


def test_doctor_names_the_package_to_install_and_the_version_it_needs() -> None:
    checks = diagnose_storage(which=lambda b: None if b in ("radosgw", "radosgw-admin") else f"/usr/bin/{b}")
    assert [(c.name, c.ok) for c in checks] == [("package radosgw", False)]
    assert "apt-get install" in checks[0].fix and "radosgw" in checks[0].fix
    jfs = lambda: "juicefs version 1.4.2+2026-10-26.pypi"  # noqa: E731
    ok = diagnose_storage(
        which=lambda b: f"/usr/bin/{b}",
        version=lambda: "ceph version 16.2.15 (618f44) pacific (stable)",
        version_of=jfs,
    )
    assert all(c.ok for c in ok)
    newer = diagnose_storage(
        which=lambda b: f"/usr/bin/{b}", version=lambda: "ceph version 18.2.4 (e7ad) reef", version_of=jfs
    )
    (ceph,) = [c for c in newer if c.name == "ceph version"]
    assert not ceph.ok and "Ceph 16" in ceph.fix
    assert ceph_major("nothing") is None
    # The monitoring's programs are checked too (ADR 0049).
    probe = diagnose_storage(which=lambda b: None if b == "prometheus-blackbox-exporter" else f"/usr/bin/{b}")
    assert [(c.name, c.ok) for c in probe] == [("package prometheus-blackbox-exporter", False)]


def test_drill_bad_input_exits_2(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    r = CliRunner().invoke(app, ["drill", "run", "nosuch", "--drills-dir", str(tmp_path)])
    said = " ".join(r.output.split())  # rich wraps long lines
    assert r.exit_code == 2 and "no drill 'nosuch'" in said and "known: a" in said
    (tmp_path / "b.json").write_text("{torn")
    r = CliRunner().invoke(app, ["drill", "list", "--drills-dir", str(tmp_path)])
    assert r.exit_code == 2 and "b.json: not JSON" in " ".join(r.output.split())


def test_the_verdict_is_read_from_the_journal_not_judged_again() -> None:
    v = judge_drill(
        DrillInputs(
            "d",
            DrTargets(30, 60),
            1000.0,
            1010.0,
            RestoredCheckpoint("c", 4, 995.0, True),
            checkpoints_restored=1,
        )
    )
    journal = {
        "steady_states": {
            "after": {
                "probes": [
                    {"activity": {"name": "object-store-available"}, "output": {"status": "available"}},
                    {"activity": {"name": VERDICT_PROBE}, "output": v.to_doc()},
                ]
            }
        }
    }
    assert verdict_from_journal(json.loads(json.dumps(journal))) == v
    assert verdict_from_journal({"steady_states": {"after": None}}) is None
    assert (
        verdict_from_journal(
            {
                "steady_states": {
                    "after": {
                        "probes": [
                            {
                                "activity": {"name": VERDICT_PROBE},
                                "output": {"outcome": "PASS", "before_fault": True},
                            }
                        ]
                    }
                }
            }
        )
        is None
    )


def test_down_removes_a_run_whose_daemons_are_gone(tmp_path: Path) -> None:
    base = tmp_path / "st" / "storage" / "run-abcdef"
    (base / "osd" / "0").mkdir(parents=True)
    (base / "osd" / "0" / "block").write_bytes(b"\0" * 10)
    dead = SandboxProcess(
        name="ceph-osd.0",
        pid=2**22 - 7,
        start_time=1,
        launch=Launch(program=["ceph-osd"], log=str(base / "log")),
    )
    write_storage_state(
        StorageSandboxState(
            stack="st",
            run_id="abcdef",
            phase="up",
            base_dir=str(base),
            created_at=time.time(),
            processes=[dead],
        ),
        tmp_path,
    )
    report = storage_down("st", tmp_path)
    assert report is not None and report.clean
    assert not base.exists() and not storage_state_path("st", tmp_path).exists()
    assert not (tmp_path / "st").exists()
    assert storage_down("st", tmp_path) is None  # idempotent
