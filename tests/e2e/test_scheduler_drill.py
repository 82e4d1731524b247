"""End-to-end: drill 3, "scheduler state lost", on the real Slurm sandbox (slurmctld 22.05): the state
backup job's copies proven in a scratch slurmctld, a corrupt copy refused by it, and the drill played
with `gpufleet drill run` (the running training job and the queued jobs come back with the same
JobIds, training goes on, RPO/RTO judged against the stack's dr targets).

Needs root, Slurm, Prometheus and PyTorch (the sandbox); about 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import wait_until

from gpufleet.chaos.backends.slurm_state_fault import RECORD
from gpufleet.chaos.scheduler_drill import DRILL_RECORD, QUEUED_PREFIX
from gpufleet.core.jsonl import read_objects
from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.core.slurm_state_backups import (
    _archive,
    _extract,
    backup_dir,
    list_evidence,
    live_jobs,
    verify_in_scratch,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STACK = "sandbox-storage"  # the shipped sandbox stack with dr targets (RPO 30 s, RTO 60 s, backups every 5 s)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("drill3-sbx")
    e = {**os.environ, "GPUFLEET_SANDBOX_ROOT": str(root), "GPUFLEET_LEDGER": str(root / "ledger.jsonl")}
    up = subprocess.run([str(BIN / "gpufleet"), "sandbox", "up", "--stack", STACK], env=e, cwd=REPO,
                        capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, f"sandbox up failed:\n{up.stdout}\n{up.stderr}"
        yield e
    finally:
        subprocess.run([str(BIN / "gpufleet"), "chaos", "revert"], env=e, cwd=REPO, timeout=120)
        down = subprocess.run([str(BIN / "gpufleet"), "sandbox", "down", "--stack", STACK], env=e, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr


def _state(env: dict[str, str]) -> SandboxState:
    return read_state(STACK, Path(env["GPUFLEET_SANDBOX_ROOT"]))


def _drill(env: dict[str, str], tmp_path: Path, name: str) -> dict[str, Any]:
    """`gpufleet drill run <name>`, asserted to PASS; its verdict from the journal."""
    journal = tmp_path / "journal.json"
    run = subprocess.run([str(BIN / "gpufleet"), "drill", "run", name, "--stack", STACK,
                          "--journal", str(journal)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=400)
    print(run.stdout[-3000:])
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert f"{name}: PASS" in run.stdout
    doc = json.loads(journal.read_text())
    verdict: dict[str, Any] = next(p["output"] for p in doc["steady_states"]["after"]["probes"]
                                   if p["activity"]["name"] == "drill-within-targets")
    assert verdict["outcome"] == "PASS", verdict
    return verdict


def test_state_backups_are_proven_in_a_scratch_slurmctld_and_a_corrupt_one_is_refused(
    env: dict[str, str], tmp_path: Path
) -> None:
    state = _state(env)
    evidence = wait_until("a verified Slurm state backup holding the training job", lambda: [
        e for e in list_evidence(backup_dir(state))
        if e.verified and any(j.name == state.training_job_name and j.state == "RUNNING" for j in e.jobs)
    ], 90)
    e = evidence[-1]
    assert e.load_seconds is not None and e.paused_seconds < 1.0 and e.bytes > 0 and len(e.sha256) == 64
    assert set(e.live_before) & set(e.live_after) <= e.job_ids()
    # A job_state cut in half (a torn copy): the scratch slurmctld, without -i, refuses to start.
    _extract(backup_dir(state) / e.archive, tmp_path / "src")
    js = tmp_path / "src" / "job_state"
    js.write_bytes(js.read_bytes()[: js.stat().st_size // 2])
    _archive(tmp_path / "src", tmp_path / "bad.tar.gz")
    jobs, why, _ = verify_in_scratch(state, tmp_path / "bad.tar.gz", tmp_path / "scratch")
    assert jobs is None and why is not None and "Incomplete job state save file" in why, why


def test_drill_scheduler_state_lost_brings_the_jobs_back(env: dict[str, str], tmp_path: Path) -> None:
    before = _state(env)
    ctld_before = next(p for p in before.processes if p.name == "slurmctld")
    verdict = _drill(env, tmp_path, "scheduler-state-lost")
    assert verdict["rpo_seconds"] <= 30 and verdict["rto_seconds"] <= 60
    after = _state(env)
    ctld_after = next(p for p in after.processes if p.name == "slurmctld")
    assert ctld_after.pid != ctld_before.pid  # a new controller, from the restored state
    records = read_objects(Path(after.base_dir) / "slurm" / RECORD)
    lost = next(r for r in records if r["event"] == "state_lost")
    restored = next(r for r in records if r["event"] == "state_restored")
    assert Path(lost["aside"]).is_dir()  # the lost state stays, moved aside, for an operator
    active = {j["id"]: j for j in lost["jobs"] if j["state"] in ("RUNNING", "PENDING")}
    back = {j["id"]: j for j in restored["jobs"]}
    expected = set(restored["backup_jobs"]) & set(active)
    assert expected and expected <= set(back), (expected, back)
    train = [i for i, j in active.items() if j["name"] == before.training_job_name]
    assert train and back[train[0]]["state"] == "RUNNING"  # the same JobId, still running
    drill_jobs = [i for i, j in active.items() if j["name"].startswith(QUEUED_PREFIX)]
    queued = [i for i in drill_jobs if i in expected]
    assert len(queued) >= 2 and all(back[i]["state"] == "PENDING" for i in queued)
    # A job submitted after the backup the restore loaded is lost with the state (what RPO counts).
    drilled = read_objects(Path(after.base_dir) / "slurm" / DRILL_RECORD)
    late = [i for r in drilled if r["event"] == "after_backup" for i in r["jobs"]]
    assert late
    for i in late:
        if i not in restored["backup_jobs"]:
            assert i not in back or not back[i]["name"].startswith(QUEUED_PREFIX + "late-"), back
            assert any(f"lost with the state (RPO): {i}" in n for n in verdict["notes"]), verdict["notes"]
    # The drill's rollback cancelled its own jobs; the training job runs on under the new controller.
    now = {j.id: j for j in live_jobs(after) or []}
    assert now[train[0]].state == "RUNNING"
    assert not [j for j in now.values() if j.name.startswith(QUEUED_PREFIX) and j.state == "PENDING"]


def test_drill_scheduler_host_lost_restores_from_the_off_host_copy(
    env: dict[str, str], tmp_path: Path
) -> None:
    """With the stack's storage sandbox up beside it, the backup job ships each verified backup to
    the backup bucket; the controller's host is lost with its state and its own backups, and the
    restore fetches the newest verified copy from the bucket (ADR 0069)."""
    gpufleet = [str(BIN / "gpufleet"), "sandbox"]
    up = subprocess.run([*gpufleet, "up", "--storage", "--stack", STACK], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=400)
    try:
        assert up.returncode == 0, f"storage up failed:\n{up.stdout}\n{up.stderr}"
        state = _state(env)
        events = Path(state.base_dir) / "slurm" / "state-backup.jsonl"
        shipped = wait_until("a state backup copied off the host and read back", lambda: [
            e for e in read_objects(events) if (e.get("offsite") or {}).get("verified")], 90)
        assert shipped[-1]["offsite"]["key"] == f"slurm-state/{shipped[-1]['archive']}"
        verdict = _drill(env, tmp_path, "scheduler-host-lost")
        records = read_objects(Path(state.base_dir) / "slurm" / RECORD)
        lost = [r for r in records if r["event"] == "state_lost"][-1]
        restored = [r for r in records if r["event"] == "state_restored"][-1]
        assert lost["scope"] == "controller-host" and Path(lost["backups_aside"]).is_dir()
        assert restored["from"] == "backup bucket" and restored["backup"], restored
        # The copy it fetched is back on the host, and the training job runs on under the new controller.
        assert (backup_dir(_state(env)) / restored["backup"]).is_file()
        assert any("off-host copy" in n for n in verdict["notes"]), verdict["notes"]
        print(f"scheduler-host-lost: RPO {verdict['rpo_seconds']} s, RTO {verdict['rto_seconds']} s, "
              f"restored {restored['backup']} from the backup bucket")
        train = next(j for j in live_jobs(_state(env)) or [] if j.name == state.training_job_name)
        assert train.state == "RUNNING"
    finally:
        subprocess.run([*gpufleet, "down", "--storage", "--stack", STACK], env=env, cwd=REPO, timeout=300)
