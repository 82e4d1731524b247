"""The training job's checkpoints straight on S3 (ADR 0070): the fenced writer's rules hold on a
bucket prefix as on a folder, the layout is core.s3_checkpoints', and the sandbox refuses an S3
location it cannot serve. S3 here is an in-memory double (memory_s3.py); the e2e tests run the job
against radosgw."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from memory_s3 import MemoryS3

from gpufleet.config.load import load_stack
from gpufleet.core.errors import InputError
from gpufleet.core.job_checkpoints import CkptKey, Loaded
from gpufleet.core.s3 import read_location
from gpufleet.core.s3_job_checkpoints import (
    NODE_S3_PORT,
    S3JobCheckpoints,
    job_prefix,
    job_prefixes,
    parse_s3_url,
)
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.storage import s3_job
from gpufleet.sandbox.training.checkpoint import CheckpointDir, CheckpointPrefix, StaleGeneration

K = CkptKey
PREFIX = "jobs/job-r1/"


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "folder":
        return lambda: CheckpointDir(tmp_path)
    s3 = MemoryS3()
    return lambda: CheckpointPrefix(s3, "ckpt", PREFIX)


def test_resume_takes_the_newest_valid_and_prefers_a_newer_generation(store: Any) -> None:
    d = store()
    d.claim((5, 0))
    for step in (10, 20, 30):
        d.write((5, 0), step, f"p{step}".encode(), {})
    d.claim((5, 1))
    d.write((5, 1), 5, b"g1-5", {})
    loaded, skipped = d.newest_valid()
    assert isinstance(loaded, Loaded) and loaded.key == K(5, 1, 5) and loaded.payload == b"g1-5"
    assert skipped == []
    with pytest.raises(StaleGeneration, match="already exists"):
        d.write((5, 1), 5, b"again", {})


def test_a_stale_generation_can_neither_write_nor_prune(store: Any) -> None:
    old, new = store(), store()
    old.claim((9, 0))
    old.write((9, 0), 20, b"g0-20", {})
    new.claim((9, 1))
    with pytest.raises(StaleGeneration, match="stale"):
        old.write((9, 0), 40, b"g0-40", {})
    with pytest.raises(StaleGeneration):
        old.claim((9, 0))
    new.write((9, 1), 40, b"g1-40", {})
    assert old.prune((9, 0), 1) == []
    assert new.prune((9, 1), 1) == [K(9, 0, 20)]
    assert new.keys() == [K(9, 1, 40)]


def test_a_write_fenced_while_it_ran_is_withdrawn(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d = store()
    d.claim((3, 0))
    real_put = type(d).put

    def put_then_newer_claims(self: Any, key: CkptKey, payload: bytes, meta: bytes, manifest: Any) -> None:
        real_put(self, key, payload, meta, manifest)
        store().claim((3, 1))  # the next incarnation starts while this one writes

    monkeypatch.setattr(type(d), "put", put_then_newer_claims)
    with pytest.raises(StaleGeneration, match="started while"):
        d.write((3, 0), 20, b"late", {})
    assert d.keys() == [] and d.stems() == []


def test_on_s3_the_manifest_is_written_last_and_a_cut_off_save_is_skipped() -> None:
    s3 = MemoryS3()
    d = CheckpointPrefix(s3, "ckpt", PREFIX)
    d.claim((6, 0))
    key = d.write((6, 0), 10, b"complete", {"world_size": 2})
    stem = key.stem
    assert s3.puts == [f"{PREFIX}fence/gen-0000000006-000000", f"{PREFIX}{stem}/{stem}.pt",
                       f"{PREFIX}{stem}/{stem}.meta.json", f"{PREFIX}{stem}/MANIFEST.json"]
    # A save cut off before its manifest (the rank killed, radosgw gone mid-upload).
    cut = K(6, 0, 20).stem
    s3.put_object(Bucket="ckpt", Key=f"{PREFIX}{cut}/{cut}.pt", Body=b"half")
    # A checkpoint whose shard rotted after its manifest was written: same size, other bytes.
    d.write((6, 0), 15, b"fifteen", {})
    s15 = K(6, 0, 15).stem
    s3.put_object(Bucket="ckpt", Key=f"{PREFIX}{s15}/{s15}.pt", Body=b"fifteeN")
    loaded, skipped = S3JobCheckpoints(s3, "ckpt", PREFIX).newest_valid()
    assert loaded is not None and loaded.key == key and loaded.payload == b"complete"
    assert [k for k, _ in skipped] == [K(6, 0, 20), K(6, 0, 15)]
    assert "incomplete" in skipped[0][1] and "sha256" in skipped[1][1]
    good, bad = S3JobCheckpoints(s3, "ckpt", PREFIX).verify_all()
    assert [g.key for g in good] == [key] and [k for k, _ in bad] == [K(6, 0, 15)]


def test_a_save_into_a_lost_bucket_fails_as_s3_answers() -> None:
    s3 = MemoryS3()
    d = CheckpointPrefix(s3, "ckpt", PREFIX)
    d.claim((1, 0))
    s3.buckets.clear()  # drill checkpoint-bucket-lost
    with pytest.raises(ClientError, match="NoSuchBucket"):
        d.write((1, 0), 20, b"x", {})


def test_job_prefixes_are_found_below_a_folder_beside_the_writers_checkpoints() -> None:
    s3 = MemoryS3()
    CheckpointPrefix(s3, "ckpt", "jobs/job-a/").claim((1, 0))
    w = CheckpointPrefix(s3, "ckpt", "jobs/job-b/")
    w.claim((2, 0))
    w.write((2, 0), 20, b"x", {})
    s3.put_object(Bucket="ckpt", Key="ckpt-0000000001-000000-000000003/MANIFEST.json", Body=b"{}")
    assert job_prefixes(s3, "ckpt") == ["jobs/job-a/", "jobs/job-b/"]
    assert job_prefixes(s3, "ckpt", "jobs/") == ["jobs/job-a/", "jobs/job-b/"]
    assert job_prefixes(s3, "ckpt", "other/") == []


@pytest.mark.parametrize(("url", "want"), [
    ("s3://checkpoints/jobs", ("checkpoints", "jobs")),
    ("s3://checkpoints/a/b/", ("checkpoints", "a/b")),
    ("s3://checkpoints", None),
    ("s3://checkpoints/../x", None),
    ("juicefs://jfs/checkpoints", None),
])
def test_parse_s3_url(url: str, want: tuple[str, str] | None) -> None:
    assert parse_s3_url(url) == want


def _storage(tmp_path: Path, phase: str = "up") -> StorageSandboxState:
    creds = tmp_path / "s3.json"
    creds.write_text('{"access_key": "AK", "secret_key": "SK"}')
    return StorageSandboxState.model_validate({
        "stack": "sandbox-storage", "run_id": "r1", "phase": phase, "base_dir": str(tmp_path),
        "created_at": 1.0,
        "s3_endpoint": "http://127.0.0.1:41234", "s3_credentials": str(creds),
        "checkpoint_bucket": "checkpoints", "backup_bucket": "checkpoints-backup"})


def _spec(location: str) -> Any:
    spec = load_stack(Path("stacks/Pulumi.sandbox-storage.yaml"))
    return spec.model_copy(update={"storage": spec.storage.model_copy(update={
        "checkpoint": spec.storage.checkpoint.model_copy(update={"location": location})})})


def test_the_job_target_is_the_storage_sandboxs_bucket_through_the_nodes_loopback(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    loc = s3_job.job_target("sandbox-storage", _spec("s3://checkpoints/jobs"), storage, "r9")
    assert loc is not None and s3_job.radosgw_port(storage) == 41234
    assert (loc.endpoint, loc.bucket, loc.prefix) == (f"http://127.0.0.1:{NODE_S3_PORT}", "checkpoints",
                                                      job_prefix("jobs", "r9"))
    assert loc.prefix == "jobs/job-r9/" and loc.access_key == "AK"
    path = tmp_path / "training" / "s3-location.json"
    s3_job.write_location(path, loc)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_location(path) == loc
    assert s3_job.job_target("sandbox-storage", _spec("/var/ckpt"), None, "r9") is None


@pytest.mark.parametrize(("location", "phase", "says"), [
    ("s3://other/jobs", "up", "names bucket 'other'"),
    ("s3://checkpoints", "up", "expected s3://<bucket>/<folder>"),
    ("s3://checkpoints/jobs", "failed", "not up: run `gpufleet sandbox up --storage"),
])
def test_an_s3_location_the_sandbox_cannot_serve_is_refused(
    tmp_path: Path, location: str, phase: str, says: str
) -> None:
    with pytest.raises(InputError) as e:
        s3_job.job_target("sandbox-storage", _spec(location), _storage(tmp_path, phase), "r9")
    assert "storage.checkpoint.location" in str(e.value) and says in str(e.value)


def test_a_lost_bucket_is_restored_with_the_jobs_prefix_and_the_drill_reads_the_job_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backup (sandbox.storage.backup) -> the bucket deleted -> restore (storage_undo): the job's
    checkpoints come back verified under the job's own prefix, recorded as the drill reads them."""
    import json

    from gpufleet.chaos.backends import storage_undo
    from gpufleet.chaos.storage import job_drill
    from gpufleet.core.s3_checkpoints import S3CheckpointStore
    from gpufleet.core.sandbox_contract import SandboxState, write_state
    from gpufleet.sandbox.storage import backup
    from gpufleet.sandbox.storage.writer import Events

    s3 = MemoryS3(buckets=("checkpoints", "checkpoints-backup"))
    state = _storage(tmp_path)
    stores = lambda _state, bucket, prefix="", **_: S3CheckpointStore(s3, bucket, prefix)  # noqa: E731
    monkeypatch.setattr(backup, "store_for", stores)
    monkeypatch.setattr(backup, "checkpoint_store_of", lambda st: stores(st, "checkpoints"))
    monkeypatch.setattr(storage_undo, "store_for", stores)
    monkeypatch.setattr(storage_undo, "read_storage_state", lambda *_: state)
    job = CheckpointPrefix(s3, "checkpoints", "jobs/job-r9/")
    job.claim((4, 0))
    for step in (20, 40, 60):
        job.write((4, 0), step, f"model {step}".encode(), {"world_size": 2})
    events = Events(tmp_path / "backup.jsonl")
    assert backup.backup_once(state, events) == 3
    evidence = json.loads(s3.objects[("checkpoints-backup", f"evidence/jobs/job-r9/{K(4, 0, 60).stem}.json")])
    assert evidence["verified"] is True and evidence["job_prefix"] == "jobs/job-r9/"
    assert backup.backup_once(state, events) == 0  # nothing new: nothing copied again

    for b, k in [key for key in s3.objects if key[0] == "checkpoints"]:
        del s3.objects[(b, k)]
    s3.buckets.discard("checkpoints")  # drill checkpoint-bucket-lost
    storage_undo.rb_restore_bucket({"stack": "sandbox-storage"})
    restore = [json.loads(line) for line in state.events_file("restore").read_text().splitlines()][-1]
    assert restore["restored"] == [] and restore["job_corrupt"] == []
    assert [(r["folder"], r["step"]) for r in restore["job_verified"]] == [("job-r9", 60), ("job-r9", 40),
                                                                           ("job-r9", 20)]
    good, bad = S3JobCheckpoints(s3, "checkpoints", "jobs/job-r9/").verify_all()
    assert [g.key.step for g in good] == [20, 40, 60] and bad == []
    # The fence came back with them: the job prunes again, and a stale generation is still refused.
    assert job.fence() == (4, 0) and job.prune((4, 0), 2) == [K(4, 0, 20)]
    with pytest.raises(StaleGeneration):
        CheckpointPrefix(s3, "checkpoints", "jobs/job-r9/").write((3, 0), 80, b"stale", {})
    job.write((4, 0), 20 * 4, b"model 80", {})

    # The drill finds the job through the Slurm sandbox's location file, by its prefix's name.
    loc = s3_job.job_target("sandbox-storage", _spec("s3://checkpoints/jobs"), state, "r9")
    assert loc is not None
    s3_job.write_location(tmp_path / "loc.json", loc)
    write_state(SandboxState(stack="sandbox-storage", run_id="r9", phase="up", base_dir=str(tmp_path),
                             created_at=0.0, checkpoint_dir=str(tmp_path / "ck"),
                             checkpoint_s3=str(tmp_path / "loc.json"),
                             training_events=str(tmp_path / "events.jsonl")), tmp_path)
    found = job_drill.job_on_bucket(state, tmp_path)
    assert found is not None and found.folder == "job-r9" and found.events_file == tmp_path / "events.jsonl"
    assert job_drill.job_on_volume(state, tmp_path) is None
    # The oracle re-reads the newest restored save before the failure by sha256.
    reader = S3JobCheckpoints(s3, "checkpoints", "jobs/job-r9/")
    assert job_drill.recheck_newest(reader, "job-r9", restore, failed_at=10**10) == {K(4, 0, 60).stem: None}
    s60 = K(4, 0, 60).stem
    s3.put_object(Bucket="checkpoints", Key=f"jobs/job-r9/{s60}/{s60}.pt", Body=b"model 6X")
    assert "sha256" in str(job_drill.recheck_newest(reader, "job-r9", restore, failed_at=10**10)[s60])
    job.remove(K(4, 0, 60))  # pruned by the job since: not corruption, not there to check
    assert job_drill.recheck_newest(reader, "job-r9", restore, failed_at=10**10) == {}
