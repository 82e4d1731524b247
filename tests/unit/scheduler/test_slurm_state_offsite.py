"""Off-host copies of the Slurm state backups (core.slurm_state_offsite): shipped archive first and
evidence last, read back by sha256; a restore with no usable backup on the host fetches the newest
verified copy that still matches; the controller-host fault and its drill. S3 here is an in-memory
double of the five calls the module makes; the e2e tier runs them on radosgw."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpufleet.catalog import parse_injection
from gpufleet.catalog.injection import SlurmStateLoss
from gpufleet.chaos.scheduler_drill import Observed, drill_inputs
from gpufleet.core import slurm_state_offsite as off
from gpufleet.core.slurm_backup_checks import JobEntry, StateBackupEvidence, archive_name, evidence_name
from gpufleet.core.slurm_state_backups import SlurmBackupError, restore_newest
from gpufleet.slo.dr import DrTargets, judge_drill
from gpufleet.slo.verdict import Outcome

REPO = Path(__file__).resolve().parents[3]


class MemoryS3:
    """upload_file, get_object, put_object, list_objects_v2 pages and delete_objects, in memory."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.order: list[str] = []  # keys in the order they were written

    def upload_file(self, filename: str, bucket: str, key: str) -> None:
        self.put_object(Bucket=bucket, Key=key, Body=Path(filename).read_bytes())

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self.objects[(Bucket, Key)] = Body
        self.order.append(Key)

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[(Bucket, Key)])}

    def get_paginator(self, _name: str) -> Any:
        store = self

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                keys = sorted(k for b, k in store.objects if b == Bucket and k.startswith(Prefix))
                return [{"Contents": [{"Key": k} for k in keys]}]

        return Pages()

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> None:
        for o in Delete["Objects"]:
            self.objects.pop((Bucket, o["Key"]), None)


def _backup(folder: Path, taken_at: float, jobs: int = 2, verified: bool = True) -> StateBackupEvidence:
    """A real archive (a job_state file in a tar.gz) and its evidence, on the host."""
    folder.mkdir(parents=True, exist_ok=True)
    name = archive_name(taken_at)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = f"jobs at {taken_at}".encode()
        info = tarfile.TarInfo("job_state")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (folder / name).write_bytes(buf.getvalue())
    e = StateBackupEvidence(
        archive=name, taken_at=taken_at, seconds=1.0, paused_seconds=0.01, bytes=len(buf.getvalue()), files=1,
        sha256=hashlib.sha256(buf.getvalue()).hexdigest(), verified=verified,
        jobs=[JobEntry(id=str(i), name="q", state="PENDING", submitted="2026-12-05T05:00:00")
              for i in range(1, jobs + 1)])
    (folder / evidence_name(name)).write_text(e.model_dump_json())
    return e


def test_a_backup_is_shipped_archive_first_read_back_and_vouched_for_last(tmp_path: Path) -> None:
    s3 = MemoryS3()
    e = _backup(tmp_path / "host", 1000.0)
    got = off.ship(s3, "bk", tmp_path / "host", e)
    assert got["verified"] is True and got["key"] == f"slurm-state/{e.archive}"
    assert s3.order == [f"slurm-state/{e.archive}", f"slurm-state/{evidence_name(e.archive)}"]
    assert [x.archive for x in off.list_offsite(s3, "bk")] == [e.archive]


def test_a_copy_that_reads_back_otherwise_is_never_vouched_for(tmp_path: Path) -> None:
    class Rotting(MemoryS3):
        def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
            return {"Body": io.BytesIO(b"bit rot")}

    s3 = Rotting()
    e = _backup(tmp_path / "host", 1000.0)
    got = off.ship(s3, "bk", tmp_path / "host", e)
    assert got["verified"] is False and "read back with sha256" in got["problem"]
    assert s3.order == [f"slurm-state/{e.archive}"]  # no evidence: never a restore candidate


def test_a_restore_with_nothing_on_the_host_fetches_the_newest_copy_that_matches(tmp_path: Path) -> None:
    s3 = MemoryS3()
    host = tmp_path / "host"
    old = _backup(host, 1000.0)
    new = _backup(host, 1005.0, jobs=3)
    for e in (old, new):
        off.ship(s3, "bk", host, e)
    s3.objects[("bk", f"slurm-state/{new.archive}")] = b"damaged in the bucket"
    lost = tmp_path / "lost-host"  # the host's backups folder is gone with the host
    fetched = off.fetch_newest(s3, "bk", lost)
    assert fetched.archive == old.archive  # the newest one no longer matches its sha256
    chosen = restore_newest(lost, tmp_path / "ctld")
    assert chosen.archive == old.archive and (tmp_path / "ctld" / "job_state").read_text() == "jobs at 1000.0"
    with pytest.raises(SlurmBackupError, match=r"no verified off-host state backup in s3://empty/slurm-state/"):
        off.fetch_newest(MemoryS3(), "empty", tmp_path / "x")


def test_the_bucket_keeps_the_newest_copies(tmp_path: Path) -> None:
    s3 = MemoryS3()
    for i in range(5):
        off.ship(s3, "bk", tmp_path / "host", _backup(tmp_path / "host", 1000.0 + i))
    off.prune_offsite(s3, "bk", keep=2)
    assert [e.taken_at for e in off.list_offsite(s3, "bk")] == [1003.0, 1004.0]
    assert len(s3.objects) == 4  # two archives, two evidence files


def test_no_storage_sandbox_means_no_off_host_copies(tmp_path: Path) -> None:
    assert off.offsite_for("sandbox-storage", tmp_path) is None


def test_the_fault_takes_a_scope_and_the_catalog_default_is_the_state_directory() -> None:
    assert parse_injection({"method": "slurm-state-loss"}) == SlurmStateLoss(scope="state-dir")
    host = parse_injection({"method": "slurm-state-loss", "scope": "controller-host"})
    assert isinstance(host, SlurmStateLoss) and host.scope == "controller-host"
    with pytest.raises(ValueError, match="scope"):
        SlurmStateLoss.model_validate({"scope": "the-whole-rack"})


def test_a_restore_from_the_bucket_is_said_in_the_verdict() -> None:
    jobs = [JobEntry(id=str(i), name="train" if i == 1 else "q", state="RUNNING" if i == 1 else "PENDING",
                     submitted="2026-12-05T05:00:00") for i in (1, 2)]
    backup = StateBackupEvidence(archive="slurm-state-x", taken_at=95.0, seconds=1, paused_seconds=0.01,
                                 bytes=1, files=1, sha256="0" * 64, verified=True, jobs=jobs)
    o = Observed(failed_at=100.0, jobs_before=jobs, restore={"t": 106.0, "backup": "slurm-state-x",
                                                            "from": "backup bucket"},
                 backup=backup, jobs_now=jobs, training_job="train", steps=[], first_new_step=None,
                 submitted_after_backup=[])
    v = judge_drill(drill_inputs("scheduler-host-lost", DrTargets(30, 60), o))
    assert v.outcome is Outcome.UNKNOWN  # no new step observed: never a pass
    assert any("restored from the off-host copy of slurm-state-x in the backup bucket" in n for n in v.notes)


def test_the_host_lost_drill_waits_for_an_off_host_copy_and_loses_the_host() -> None:
    doc = json.loads((REPO / "experiments" / "drills" / "scheduler-host-lost.json").read_text())
    steps = {a["name"]: a["provider"] for a in doc["method"]}
    assert steps["wait-for-a-verified-off-host-state-backup"]["arguments"]["offsite"] is True
    assert steps["controller-host-loss"]["func"] == "slurm_state_loss"
    assert steps["controller-host-loss"]["arguments"] == {"scope": "controller-host"}
    probe = doc["steady-state-hypothesis"]["probes"][0]["provider"]
    assert probe["arguments"]["drill"] == "scheduler-host-lost"
