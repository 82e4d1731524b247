"""End to end: the cluster backup CronJobs' program (`python -m gpufleet.infra.backup_jobs`, what
gpufleet.infra.backups declares) run against the storage sandbox's real radosgw (Ceph 16), Redis
metadata engine and JuiceFS volume (stack sandbox-storage-juicefs), as the CronJobs' pods would run
it: the settings file the program renders (endpoint and bucket names pointed at the sandbox), keys in
the environment. No kubelet runs the CronJobs on the Kubernetes sandbox (kwok nodes), so this is
where their program meets a real object store and metadata engine.

- settings: the checkpoint and a backup bucket versioned, the noncurrent-version rule and a private
  ACL applied, read back from radosgw; run twice (idempotent); a public-read ACL put by hand is
  reported and taken back by the next run.
- dump + verify: a `juicefs dump` of the live engine uploaded, proven in a fresh scratch Redis, its
  evidence written; a truncated dump fails verification (exit 1) and is never the newest verified.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import REPO, gpufleet

from gpufleet.config import load_named_stack
from gpufleet.core import juicefs as jfs
from gpufleet.core import s3
from gpufleet.core.juicefs_backups import list_evidence
from gpufleet.core.storage_contract import S3Credentials, StorageSandboxState, read_storage_state
from gpufleet.infra.backup_jobs import LIFECYCLE_RULE_ID, Settings, read_back
from gpufleet.infra.backups import ENV_BACKUP_KEYS, ENV_CHECKPOINT_KEYS, bucket_settings

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the storage sandbox runs Ceph daemons as root"),
    pytest.mark.skipif(shutil.which("ceph-osd") is None, reason="Ceph is not installed (make apt)"),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="Redis is not installed (make apt)"),
    pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="JuiceFS mounts through FUSE: no /dev/fuse"),
]
STACK = "sandbox-storage-juicefs"
BACKUP = "cluster-backup"  # not the sandbox's own backup bucket, which its backup process writes


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageSandboxState]:
    root = tmp_path_factory.mktemp("backup-jobs-root")
    up = gpufleet(root, "sandbox", "up", "--storage", "--stack", STACK, "--timeout", "900", timeout=1000)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield read_storage_state(STACK, root)
    finally:
        down = gpufleet(root, "sandbox", "down", "--storage", "--stack", STACK, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def keys(state: StorageSandboxState) -> S3Credentials:
    assert state.s3_credentials is not None
    return S3Credentials.model_validate_json(Path(state.s3_credentials).read_text())


@pytest.fixture(scope="module")
def settings_file(state: StorageSandboxState, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program's settings for the stack, pointed at the sandbox's radosgw and its volume's bucket."""
    spec = load_named_stack(STACK, REPO / "stacks")
    assert spec.storage.ceph is not None and spec.storage.juicefs is not None and spec.dr is not None
    assert state.juicefs is not None and state.s3_endpoint is not None
    js = spec.storage.juicefs.model_copy(update={"bucket": f"{state.s3_endpoint}/{state.juicefs.bucket}"})
    ceph = spec.storage.ceph.model_copy(update={"object_store": "cluster"})  # backup bucket cluster-backup
    doc = bucket_settings(ceph, js, spec.dr)
    doc["endpoint"] = state.s3_endpoint
    path = tmp_path_factory.mktemp("settings") / "buckets.json"
    path.write_text(json.dumps(doc))
    return path


def job(role: str, settings: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.infra.backup_jobs", role, "--settings", str(settings)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd=REPO,
    )


def key_env(k: S3Credentials) -> dict[str, str]:
    # One radosgw user owns both buckets in the sandbox; a cluster has two (ADR 0060).
    return dict(zip(ENV_BACKUP_KEYS + ENV_CHECKPOINT_KEYS, (k.access_key, k.secret_key) * 2, strict=True))


def client(state: StorageSandboxState, k: S3Credentials) -> Any:
    assert state.s3_endpoint is not None
    return s3.client(state.s3_endpoint, k.access_key, k.secret_key)


def test_settings_are_applied_read_back_and_idempotent(
    state: StorageSandboxState, keys: S3Credentials, settings_file: Path
) -> None:
    c = client(state, keys)
    doc = json.loads(settings_file.read_text())
    days = doc["buckets"][0]["noncurrentVersionDays"]
    t0 = time.monotonic()
    first = job("settings", settings_file, key_env(keys))
    took = time.monotonic() - t0
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads(first.stdout)["problems"] == []
    for b in doc["buckets"]:
        assert c.get_bucket_versioning(Bucket=b["name"])["Status"] == "Enabled"
        rules = c.get_bucket_lifecycle_configuration(Bucket=b["name"])["Rules"]
        assert [(r["ID"], r["NoncurrentVersionExpiration"]["NoncurrentDays"]) for r in rules] == [
            (LIFECYCLE_RULE_ID, days)
        ]
    second = job("settings", settings_file, key_env(keys))
    assert second.returncode == 0, second.stdout + second.stderr
    # Drift: a public ACL set by hand is found by the read-back, then taken back by the next run.
    c.put_bucket_acl(Bucket=BACKUP, ACL="public-read")
    assert any("AllUsers" in p for p in read_back(c, Settings.model_validate(doc).of_role("backup")))
    third = job("settings", settings_file, key_env(keys))
    assert third.returncode == 0, third.stdout + third.stderr
    grants = c.get_bucket_acl(Bucket=BACKUP)["Grants"]
    assert not [g for g in grants if "AllUsers" in str(g.get("Grantee", {}).get("URI"))]
    print(f"settings job: {took:.2f} s for {len(doc['buckets'])} buckets")


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty Redis: what the verify pod's sidecar is."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(jfs.redis_server_argv(port, tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        ping = jfs.redis_cli(port, "PING")
        while subprocess.run(ping, capture_output=True, text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "scratch redis did not start"
            time.sleep(0.2)
        yield jfs.redis_url(port, 1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_dump_is_taken_and_proven_and_a_truncated_one_fails(
    state: StorageSandboxState, keys: S3Credentials, settings_file: Path, scratch: str
) -> None:
    assert state.juicefs is not None
    env = key_env(keys)
    applied = job("settings", settings_file, env)  # the backup bucket exists and is versioned
    assert applied.returncode == 0, applied.stdout + applied.stderr
    t0 = time.monotonic()
    dumped = job("dump", settings_file, {**env, "META_URL": state.juicefs.meta_url})
    dump_s = time.monotonic() - t0
    assert dumped.returncode == 0, dumped.stdout + dumped.stderr
    key = json.loads(dumped.stdout)["dump"]
    t0 = time.monotonic()
    verified = job("verify", settings_file, {**env, "SCRATCH_ENGINE_URL": scratch})
    verify_s = time.monotonic() - t0
    assert verified.returncode == 0, verified.stdout + verified.stderr
    evidence = jfs.DumpEvidence.model_validate_json(verified.stdout)
    assert evidence.dump == key and evidence.verified and evidence.problems == []
    assert evidence.inodes and evidence.reloaded_inodes == evidence.inodes  # the writer's checkpoints
    assert evidence.files and evidence.files > 0

    # A truncated dump (half its bytes) uploaded as a newer one: verification fails, exit 1.
    c = client(state, keys)
    body = c.get_object(Bucket=BACKUP, Key=key)["Body"].read()
    bad = jfs.dump_key(time.time())
    c.put_object(Bucket=BACKUP, Key=bad, Body=body[: len(body) // 2])
    subprocess.run(jfs.redis_cli(int(scratch.rsplit(":", 1)[1].split("/")[0]), "FLUSHALL"), check=True,
                   capture_output=True)
    failed = job("verify", settings_file, {**env, "SCRATCH_ENGINE_URL": scratch})
    assert failed.returncode == 1, failed.stdout + failed.stderr
    bad_evidence = jfs.DumpEvidence.model_validate_json(failed.stdout)
    assert bad_evidence.dump == bad and not bad_evidence.verified and bad_evidence.problems
    newest = jfs.newest_verified(list_evidence(c, BACKUP))
    assert newest is not None and newest.dump == key
    print(f"dump job: {dump_s:.2f} s, verify job: {verify_s:.2f} s, {evidence.inodes} inodes")
