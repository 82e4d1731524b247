"""End to end: the Slurm sandbox's PyTorch training job checkpointing straight to S3 (ADR 0070).

Stack sandbox-storage-s3 (storage.checkpoint.location s3://checkpoints/jobs): the storage sandbox
(real Ceph 16, radosgw) comes up first, then the Slurm sandbox, whose ranks write their checkpoints
with boto3 to jobs/job-<run id>/ of the checkpoint bucket through a relay on each node's own
loopback. Checked: the checkpoints verify by sha256 from the root namespace; a node's namespace
reaches radosgw only through the relay's port; a killed rank's next incarnation resumes from S3;
drill checkpoint-bucket-lost judges the job (its saves fail with NoSuchBucket, its prefix and fence
come back from the backup bucket, and it prunes again); drill osd-lost verifies the job's
checkpoints after re-replication; last, a node's diagnostic bundle is shipped off it through the same
relay, into the backup bucket."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import gpufleet, sandbox_up, wait_until

from gpufleet.cli.drill_cmds import verdict_from_journal
from gpufleet.core import netns, s3
from gpufleet.core.jsonl import read_objects
from gpufleet.core.s3 import read_location
from gpufleet.core.s3_job_checkpoints import NODE_S3_PORT, S3JobCheckpoints, reader_for
from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.core.storage_contract import StorageSandboxState, read_storage_state

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the storage sandbox runs Ceph daemons as root"),
    pytest.mark.skipif(shutil.which("ceph-osd") is None, reason="Ceph is not installed (make apt)"),
]
STACK = "sandbox-storage-s3"
KEEP = 3  # the job's --keep-checkpoints (jobscript.JobParams default)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # A short folder: the Slurm sandbox makes sockets under it (layout.SUN_PATH_MAX).
    root = tmp_path_factory.mktemp("s3j")
    up = gpufleet(root, "sandbox", "up", "--storage", "--stack", STACK, timeout=400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        with sandbox_up(root, STACK):
            yield root
    finally:
        down = gpufleet(root, "sandbox", "down", "--storage", "--stack", STACK, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not list(root.glob(f"{STACK}/run-*")), "the Slurm sandbox's run folder is left"


@pytest.fixture
def storage(root: Path) -> StorageSandboxState:
    return read_storage_state(STACK, root)


@pytest.fixture
def sandbox(root: Path) -> SandboxState:
    return read_state(STACK, root)


def _job(storage: StorageSandboxState, sandbox: SandboxState) -> S3JobCheckpoints:
    assert sandbox.checkpoint_s3 is not None and storage.s3_endpoint is not None
    return reader_for(read_location(Path(sandbox.checkpoint_s3)), endpoint=storage.s3_endpoint)


def _events(sandbox: SandboxState, after: float, kind: str) -> list[dict[str, Any]]:
    assert sandbox.training_events is not None
    events = read_objects(Path(sandbox.training_events))
    return [e for e in events if e.get("event") == kind and e["t"] > after]


def _drill(root: Path, name: str, journal: Path) -> tuple[Any, str]:
    run = gpufleet(root, "drill", "run", name, "--stack", STACK, "--journal", str(journal), timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    verdict = verdict_from_journal(json.loads(journal.read_text()))
    assert verdict is not None and verdict.outcome.value == "PASS", out
    return verdict, out


def test_the_job_checkpoints_to_s3_and_its_nodes_reach_only_the_relay(
    storage: StorageSandboxState, sandbox: SandboxState
) -> None:
    assert sandbox.checkpoint_s3 is not None and storage.s3_endpoint is not None
    loc_file = Path(sandbox.checkpoint_s3)
    assert stat.S_IMODE(loc_file.stat().st_mode) == 0o600  # it holds the S3 user's keys
    loc = read_location(loc_file)
    assert loc.bucket == storage.checkpoint_bucket and loc.prefix == f"jobs/job-{sandbox.run_id}/"
    assert loc.endpoint == f"http://127.0.0.1:{NODE_S3_PORT}"
    job = _job(storage, sandbox)
    newest = wait_until("a checkpoint of the job that verifies in the bucket",
                        lambda: job.newest_valid()[0], 120, 1)
    assert job.fence_names() and newest.manifest.shards[0].name == f"{newest.key.stem}.pt"
    good, bad = job.verify_all()
    assert good and bad == [], bad
    # From a training node's namespace: radosgw's own port is not there (nothing is routed), the
    # relay's is, and it answers S3 for the job's bucket.
    node = next(n for n in sandbox.nodes if n.role != "head")
    rgw_port = storage.ports["rgw"]

    def direct() -> int:
        with socket.socket() as sock:
            sock.settimeout(2)
            return sock.connect_ex(("127.0.0.1", rgw_port))

    assert netns.run_in(node.netns, direct) == errno.ECONNREFUSED

    def through_relay() -> int:
        client = s3.client(loc.endpoint, loc.access_key, loc.secret_key, attempts=1)
        return int(client.list_objects_v2(Bucket=loc.bucket, Prefix=loc.prefix).get("KeyCount", 0))

    assert netns.run_in(node.netns, through_relay) > 0


def test_a_killed_rank_s_next_incarnation_resumes_from_s3(
    storage: StorageSandboxState, sandbox: SandboxState
) -> None:
    job = _job(storage, sandbox)
    before = wait_until("a checkpoint of the job", lambda: job.newest_valid()[0], 120, 1)
    ranks = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_rank(p)]
    assert ranks, "no training rank runs"
    t_kill = time.time()
    os.kill(ranks[0], signal.SIGKILL)
    resumed = wait_until("the next incarnation resuming", lambda: _events(sandbox, t_kill, "resume"), 120, 1)
    r = resumed[0]
    assert r["job_id"] > before.key.job and r["from_job"] == before.key.job, r
    assert r["checkpoint"] >= before.key.stem, r  # from S3: at least the checkpoint seen before the kill
    saved = wait_until("the new incarnation saving to S3", lambda: [
        e for e in _events(sandbox, t_kill, "checkpoint") if e["job_id"] == r["job_id"]], 60, 1)
    newest, _ = job.newest_valid()
    assert newest is not None and newest.key.job == r["job_id"] and newest.key.step >= saved[0]["step"]
    print(f"rank killed: job {r['job_id']} resumed from {r['checkpoint']} {r['t'] - t_kill:.1f} s later")


def _is_rank(proc: Path) -> bool:
    try:
        return b"gpufleet.sandbox.training.train" in (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def test_drill_checkpoint_bucket_lost_judges_the_job(
    root: Path, storage: StorageSandboxState, sandbox: SandboxState, tmp_path: Path
) -> None:
    job = _job(storage, sandbox)
    newest = wait_until("a checkpoint of the job", lambda: job.newest_valid()[0], 60, 1)
    # A verified backup of the job's checkpoint (its evidence in the backup bucket) before the fault.
    client = job.client
    evidence = f"evidence/jobs/job-{sandbox.run_id}/{newest.key.stem}.json"
    wait_until("the job's checkpoint backed up and verified", lambda: json.loads(
        client.get_object(Bucket=storage.backup_bucket, Key=evidence)["Body"].read())["verified"], 30, 1)
    t0 = time.time()
    verdict, out = _drill(root, "checkpoint-bucket-lost", tmp_path / "drill.json")
    integrity = {c.name: c for c in verdict.checks}["integrity"]
    assert f"of the training job (job-{sandbox.run_id})" in integrity.detail, out
    assert verdict.rpo_seconds is not None and verdict.rto_seconds is not None
    failed = _events(sandbox, t0, "checkpoint_failed")
    assert failed and {e["errno"] for e in failed} == {"NoSuchBucket"}, failed
    # The job saved again after the restore; its fence came back, so it prunes to its newest KEEP.
    last_failed = max(e["t"] for e in failed)
    wait_until("the job saving again", lambda: len(_events(sandbox, last_failed, "checkpoint")) >= 3, 60, 1)
    assert job.fence_names()
    wait_until(f"the job pruned to {KEEP} checkpoints", lambda: len(job.keys()) <= KEEP + 1, 30, 1)
    good, bad = job.verify_all()
    assert good and bad == []
    print(f"checkpoint-bucket-lost on the training job: RPO {verdict.rpo_seconds} s, RTO "
          f"{verdict.rto_seconds} s, {verdict.steps_lost} steps lost; {integrity.detail}")


def test_drill_osd_lost_verifies_the_jobs_checkpoints(
    root: Path, storage: StorageSandboxState, sandbox: SandboxState, tmp_path: Path
) -> None:
    verdict, out = _drill(root, "osd-lost", tmp_path / "drill.json")
    assert f"checkpoint(s) of the training job (job-{sandbox.run_id})" in out, out
    good, bad = _job(storage, sandbox).verify_all()
    assert good and bad == []
    print(f"osd-lost with the training job on S3: RPO {verdict.rpo_seconds} s, RTO {verdict.rto_seconds} s")


def test_a_nodes_bundle_is_shipped_off_it_before_the_drain(
    root: Path, storage: StorageSandboxState, sandbox: SandboxState
) -> None:
    """XID 79 on the spare node (no rank runs there): the node-health check's hook collects the
    node's bundle and ships it, from the node's namespace through the relay, to `bundles/<node>/`
    of the storage sandbox's backup bucket; the copy matches the bundle on the node by sha256."""
    from gpufleet.core.agent_client import agent_request
    from gpufleet.core.s3_checkpoints import store_for

    assert sandbox.spare_nodes and storage.backup_bucket is not None
    node = sandbox.spare_nodes[0]
    token = Path(sandbox.agent_token_file or "").read_text().strip()
    sock = Path(sandbox.node(node).agent_socket or "")
    agent_request(sock, token, "POST", "/inject", {"gpu": 1, "field_id": 230, "value": 79, "kmsg": True})
    bundles = Path(sandbox.base_dir) / "bundles"
    pattern = f"bundle-{node}-*-node-health.tar.gz"
    local = wait_until(f"{node}'s bundle", lambda: sorted(bundles.glob(pattern)), 120, 1)[0]
    client = store_for(storage, storage.backup_bucket).client
    key = f"bundles/{node}/{local.name}"
    evidence = wait_until("the shipped bundle's evidence", lambda: json.loads(
        client.get_object(Bucket=storage.backup_bucket, Key=key + ".json")["Body"].read()), 60, 1)
    copy = client.get_object(Bucket=storage.backup_bucket, Key=key)["Body"].read()
    assert copy == local.read_bytes()
    assert evidence["sha256"] == hashlib.sha256(copy).hexdigest()
    assert evidence["manifest"]["node"] == node and "79" in (evidence["manifest"]["reason"] or "")
    print(f"bundle of {node} shipped: s3://{storage.backup_bucket}/{key} ({len(copy)} bytes)")
