"""Drill metadata-engine-lost judged on the training job that checkpoints on the volume
(gpufleet.chaos.storage.job_drill), and the job's folder verified by sha256 (core.job_checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.chaos.storage import job_drill
from gpufleet.core.job_checkpoints import CkptKey, JobCheckpoints, job_folders, verify_folder
from gpufleet.core.sandbox_contract import SandboxState, write_state
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.training.checkpoint import CheckpointDir
from gpufleet.slo.dr import DrTargets, judge_drill
from gpufleet.slo.verdict import Outcome

FAILED = 1000.0
TARGETS = DrTargets(rpo_seconds=30, rto_seconds=60)
FOLDER = "job-abc123"


def _ckpt(step: int, written_at: float, folder: str = FOLDER) -> dict[str, Any]:
    key = CkptKey(1, 0, step)
    return {"folder": folder, "checkpoint": key.stem, "key": [1, 0, step], "step": step,
            "written_at": written_at}


def _restore(**more: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "t": 1006.0,  # restored and verified 6 s after the failure
        # 980 and 990 came back from the dump; 1008 was written after the restore; another job's
        # folder is not this job's.
        "job_verified": [_ckpt(980, 980.5), _ckpt(990, 990.5), _ckpt(1008, 1008.2),
                         _ckpt(999, 999.0, folder="job-other")],
        "job_corrupt": [],
    }
    return {**base, **more}


EVENTS = [
    {"t": 990.5, "event": "checkpoint", "step": 990, "checkpoint": CkptKey(1, 0, 990).stem},
    {"t": 995.5, "event": "checkpoint", "step": 995, "checkpoint": CkptKey(1, 0, 995).stem},
    {"t": 999.0, "event": "step", "step": 998},
    {"t": 1004.0, "event": "checkpoint_failed", "step": 1000, "errno": "ENOTCONN"},
    {"t": 1007.5, "event": "step", "step": 1001},
    {"t": 1009.0, "event": "step", "step": 1010},
]


def test_the_job_is_judged_rpo_to_its_newest_restored_save_rto_to_its_first_step_after_the_restore() -> None:
    recheck = {CkptKey(1, 0, 990).stem: None}
    v = judge_drill(job_drill.job_inputs("metadata-engine-lost", TARGETS, FAILED, _restore(), FOLDER, EVENTS,
                                         recheck, writer=(4, 0)))
    assert v.outcome is Outcome.PASS, v
    assert v.rpo_seconds == 9.5  # 1000 - 990.5: step 990's save, the newest written before the failure
    assert v.rto_seconds == 7.5 and v.resumed_after_seconds == 7.5  # step 1001 at 1007.5
    assert v.steps_lost == 5  # step 995 was saved before the failure and did not come back
    integrity = {c.name: c for c in v.checks}["integrity"]
    assert integrity.detail == (f"3 checkpoint(s) of the training job ({FOLDER}) and 4 of the checkpoint "
                                "writer restored, every file verified by sha256")
    assert "the training job kept running: its saves failed or waited while the store was gone" in v.notes


def test_a_restored_save_pruned_since_is_said_and_one_that_no_longer_verifies_fails() -> None:
    name = CkptKey(1, 0, 990).stem
    pruned = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, _restore(), FOLDER, EVENTS, {}))
    assert pruned.outcome is Outcome.PASS
    assert f"{name} was pruned by the training job before this check (restore-verified)" in pruned.notes
    bad = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, _restore(), FOLDER, EVENTS,
                                           {name: "sha256 mismatch: x.pt"}))
    assert bad.outcome is Outcome.FAIL
    assert {c.name: c.outcome for c in bad.checks}["integrity"] is Outcome.FAIL
    assert bad.rpo_seconds is None  # a restored save that does not verify gives no RPO


def test_no_save_of_the_job_in_the_restored_dump_fails_the_drill() -> None:
    restore = _restore(job_verified=[_ckpt(1008, 1008.2)])  # only a save made after the restore
    v = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, restore, FOLDER, EVENTS, {}))
    assert v.outcome is Outcome.FAIL
    assert {c.name: c.detail for c in v.checks}["integrity"] == "no checkpoint was restored"
    assert f"no checkpoint of the training job ({FOLDER}) written before the failure came back" in v.notes


def test_a_corrupt_save_of_the_job_fails_integrity_and_leaves_no_rto() -> None:
    restore = _restore(job_corrupt=[{"folder": FOLDER, "checkpoint": "ckpt-x", "step": 985,
                                     "problems": ["sha256 mismatch"]}])
    v = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, restore, FOLDER, EVENTS,
                                         {CkptKey(1, 0, 990).stem: None}))
    assert v.outcome is Outcome.FAIL
    checks = {c.name: c for c in v.checks}
    assert checks["integrity"].outcome is Outcome.FAIL and "ckpt-x" in checks["integrity"].detail
    assert checks["rto"].outcome is Outcome.UNKNOWN


def test_a_job_that_never_stepped_again_or_restarted_is_said() -> None:
    quiet = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, _restore(), FOLDER, EVENTS[:4], {}))
    assert quiet.outcome is Outcome.UNKNOWN and quiet.rto_seconds is None
    assert "the training job logged no step after the restore" in quiet.notes
    restarted = [*EVENTS, {"t": 1007.0, "event": "resume", "step": 990, "job_id": 2,
                           "checkpoint": CkptKey(1, 0, 990).stem}]
    v = judge_drill(job_drill.job_inputs("d", TARGETS, FAILED, _restore(), FOLDER, restarted, {}))
    assert f"the training job restarted (job 2) from {CkptKey(1, 0, 990).stem}" in v.notes


def test_the_folder_is_verified_by_sha256_and_a_save_cut_off_is_neither_good_nor_bad(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    folder = root / FOLDER
    d = CheckpointDir(folder)
    d.claim((1, 0))
    for step in (10, 20, 30):
        d.write((1, 0), step, f"model {step}".encode(), {"world_size": 1})
    (folder / CkptKey(1, 0, 20).stem).with_suffix(".pt").write_bytes(b"bit rot")
    (folder / f"{CkptKey(1, 0, 40).stem}.pt").write_bytes(b"a save cut off: no manifest")
    (root / "ckpt-0000000001-000000-000000050").mkdir()  # the writer's layout beside it: not a job
    assert job_folders(root) == [folder]
    good, bad = verify_folder(folder)
    assert [g.key.step for g in good] == [10, 30]
    assert [(k.step, "sha256" in why) for k, why in bad] == [(20, True)]


def test_the_drill_finds_the_job_only_when_it_checkpoints_on_this_volume(tmp_path: Path) -> None:
    mnt = tmp_path / "storage" / "juicefs" / "mnt"
    storage = StorageSandboxState.model_validate({
        "stack": "s", "run_id": "1", "phase": "up", "base_dir": str(tmp_path / "storage"), "created_at": 0.0,
        "juicefs": {"name": "jfs", "meta_url": "redis://127.0.0.1:1/1", "meta_port": 1, "meta_db": 1,
                    "meta_dir": "/x", "scratch_port": 2, "bucket": "b", "mountpoint": str(mnt),
                    "cache_dir": "/y", "cache_mib": 1, "metrics": "127.0.0.1:3",
                    "checkpoint_dir": str(mnt / "checkpoints")}})
    assert job_drill.job_on_volume(storage, tmp_path) is None  # no Slurm sandbox
    sandbox = SandboxState(stack="s", run_id="abc123", phase="up", base_dir=str(tmp_path / "run"),
                           created_at=0.0, checkpoint_dir=str(tmp_path / "run" / "checkpoints"),
                           training_events=str(tmp_path / "events.jsonl"))
    write_state(sandbox, tmp_path)
    assert job_drill.job_on_volume(storage, tmp_path) is None  # its checkpoints are in its run folder
    on_volume = sandbox.model_copy(update={"checkpoint_dir": str(mnt / "checkpoints" / FOLDER)})
    write_state(on_volume, tmp_path)
    found = job_drill.job_on_volume(storage, tmp_path)
    assert found is not None and found.folder == FOLDER
    assert isinstance(found.reader, JobCheckpoints) and found.reader.root == mnt / "checkpoints" / FOLDER
