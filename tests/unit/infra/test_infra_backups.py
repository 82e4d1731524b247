"""Backups as code (gpufleet.infra.backups, ADR 0060): the stack fields at the edge, what the program
declares from a cluster stack's storage and dr sections (under the mock runtime, as `gpufleet
preview` runs it), the bucket-settings contract between the program and the CronJobs' program, and
the policy pack's backup rules, each failing on a bad stack and passing on the program's own output."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from infra_testdata import load_policies, shipped, variant
from pydantic import ValidationError

from gpufleet.config.model import backup_cron
from gpufleet.core import juicefs as jfs
from gpufleet.infra import backup_jobs, backups
from gpufleet.infra.offline import DeclaredResource, OfflinePreview

P = load_policies()
CRONJOB = "kubernetes:batch/v1:CronJob"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
STORE = "kubernetes:ceph.rook.io/v1:CephObjectStore"


def _named(view: OfflinePreview, name: str) -> DeclaredResource:
    return next(r for r in view.custom() if r.name == name)


# --------------------------------------------------------------------------- the stack's fields


@pytest.mark.parametrize(
    ("seconds", "cron"),
    [(60, "* * * * *"), (300, "*/5 * * * *"), (900, "*/15 * * * *"), (3600, "0 * * * *"),
     (7200, "0 */2 * * *"), (86400, "0 0 * * *")],
)
def test_backup_intervals_become_cron_schedules(seconds: float, cron: str) -> None:
    assert backup_cron(seconds) == cron


@pytest.mark.parametrize("seconds", [5, 90, 420, 3000, 5400, 18000, 172800])
def test_intervals_a_cronjob_cannot_keep_are_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="not a CronJob schedule"):
        backup_cron(seconds)


@given(st.sampled_from([60 * m for m in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)]
                       + [3600 * h for h in (1, 2, 3, 4, 6, 8, 12, 24)]))
def test_the_packs_cron_reading_agrees_with_the_programs_schedule(seconds: int) -> None:
    assert P.cron_max_gap_seconds(backup_cron(seconds)) == seconds


def _dr(d: dict[str, Any], **dr: Any) -> None:
    d["dr"] = {"rpoSeconds": 1800, "rtoSeconds": 3600, "backupIntervalSeconds": 900, **dr}


def test_a_cluster_stack_with_an_unschedulable_interval_is_refused_with_its_path() -> None:
    with pytest.raises(ValidationError, match=r"dr\.backupIntervalSeconds 1000 is not a CronJob schedule"):
        variant("h200-ib", lambda d: _dr(d, backupIntervalSeconds=1000, rpoSeconds=3600))


def test_backups_as_code_need_the_rook_object_store_and_juicefs_on_it() -> None:
    def no_store(d: dict[str, Any]) -> None:
        _dr(d)
        d["storage"]["ceph"]["objectStore"] = None

    with pytest.raises(ValidationError, match=r"need storage\.ceph\.objectStore"):
        variant("h200-ib", no_store)

    def juicefs_on_s3(d: dict[str, Any]) -> None:
        _dr(d)
        d["storage"]["juicefs"]["storage"] = "s3"

    with pytest.raises(ValidationError, match=r"storage\.juicefs on the Ceph object store"):
        variant("h200-ib", juicefs_on_s3)


def test_an_erasure_code_wider_than_the_racks_is_refused() -> None:
    def wide(d: dict[str, Any]) -> None:
        d["storage"]["ceph"]["objectStoreErasureCoded"] = {"dataChunks": 4, "codingChunks": 2}

    with pytest.raises(ValidationError, match=r"4\+2 chunks need as many racks, storageNodes span 3"):
        variant("h200-ib", wide)


def test_the_sandbox_stacks_keep_their_seconds_intervals() -> None:
    spec, view = shipped("sandbox-storage-juicefs")
    assert spec.dr is not None and spec.dr.backup_interval_seconds == 5
    assert not [r for r in view.custom() if "-backups-" in r.name]  # its backups are processes


# --------------------------------------------------------------------------- the program


def test_the_cluster_stack_declares_its_backups() -> None:
    spec, view = shipped("h200-ib")
    assert spec.dr is not None
    mine = sorted((r.type.rsplit(":", 1)[1], r.inputs["metadata"]["name"]) for r in view.custom()
                  if r.name.startswith("h200-ib-backups-"))
    assert mine == [
        ("CephObjectStoreUser", "gpufleet-backup"),
        ("ConfigMap", "gpufleet-bucket-settings"),
        ("CronJob", "gpufleet-backup-dump"),
        ("CronJob", "gpufleet-backup-settings"),
        ("CronJob", "gpufleet-backup-verify"),
        ("Namespace", "gpufleet-backup"),
        ("Secret", "gpufleet-backup-juicefs"),
    ]
    dump = _named(view, "h200-ib-backups-cronjob-dump").inputs
    assert dump["spec"]["schedule"] == "*/15 * * * *"
    assert dump["metadata"]["annotations"] == {"gpufleet.io/rpo-seconds": "1800"}
    pod = dump["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]}
    rook = "rook-ceph-object-user-checkpoints-gpufleet-backup"  # the Secret Rook writes for the user
    assert env == {
        "BACKUP_ACCESS_KEY": {"name": rook, "key": "AccessKey"},
        "BACKUP_SECRET_KEY": {"name": rook, "key": "SecretKey"},
        "META_URL": {"name": "gpufleet-backup-juicefs", "key": "metaurl"},
    }
    assert pod["containers"][0]["command"][:4] == ["python", "-m", "gpufleet.infra.backup_jobs", "dump"]
    verify_job = _named(view, "h200-ib-backups-cronjob-verify").inputs["spec"]["jobTemplate"]
    verify = verify_job["spec"]["template"]["spec"]
    (sidecar,) = verify["initContainers"]
    assert sidecar["image"] == backups.SCRATCH_REDIS_IMAGE and sidecar["restartPolicy"] == "Always"
    assert sidecar["command"][5:7] == ["--save", ""]  # an engine that keeps nothing
    user = _named(view, "h200-ib-backups-user").inputs
    assert user["spec"]["store"] == "checkpoints" and user["spec"]["clusterNamespace"] == "rook-ceph"
    store = _named(view, "h200-ib-storage-object-store-checkpoints").inputs["spec"]
    assert store["allowUsersInNamespaces"] == ["gpufleet-backup"]
    ec = {"dataChunks": 2, "codingChunks": 1}
    assert store["dataPool"] == {"failureDomain": "rack", "erasureCoded": ec}
    assert store["metadataPool"]["replicated"] == {"size": 3}
    assert store["gateway"]["instances"] == 2


def test_the_juicefs_secret_holds_the_stacks_secrets_only_as_pulumi_secrets() -> None:
    spec, view = shipped("h200-ib")
    secret = _named(view, "h200-ib-backups-juicefs").inputs
    # The mock runtime shows a Pulumi secret as a mark: the whole stringData is one, and nothing of
    # the stack's ciphertext appears in what the program declared.
    assert secret["stringData"] == "[secret]"
    js = spec.storage.juicefs
    assert js is not None and js.meta_url.secure is not None
    assert js.meta_url.secure not in json.dumps([r.inputs for r in view.custom()])


def test_the_settings_the_program_renders_are_what_the_jobs_read() -> None:
    _, view = shipped("h200-ib")
    text = _named(view, "h200-ib-backups-bucket-settings").inputs["data"]["buckets.json"]
    settings = backup_jobs.Settings.model_validate_json(text)
    assert settings.endpoint == "http://rook-ceph-rgw-checkpoints.rook-ceph.svc:80"
    got = [(b.name, b.role, b.create, b.noncurrent_version_days, b.encryption) for b in settings.buckets]
    assert got == [
        ("checkpoints", "checkpoint", False, 14, "none"),  # Ceph 19 without an SSE-S3 key backend
        ("checkpoints-backup", "backup", True, 14, "none"),
    ]


def test_bucket_encryption_follows_what_the_backend_can_do() -> None:
    assert backups.ceph_major("quay.io/ceph/ceph:v19.2.2") == 19
    assert backups.bucket_encryption(16, kms=True) == "none"  # Pacific: no SSE-S3 at all
    assert backups.bucket_encryption(19, kms=False) == "none"  # no key backend: nothing to encrypt with
    assert backups.bucket_encryption(19, kms=True) == "AES256"


def test_the_pack_and_the_program_name_the_same_things() -> None:
    assert P.BACKUP_ROLE_LABEL == backups.ROLE_LABEL
    assert P.BUCKET_SETTINGS_LABEL == backups.SETTINGS_LABEL
    assert P.BUCKET_SETTINGS_FILE == backups.SETTINGS_FILE
    assert P.RPO_ANNOTATION == backups.RPO_ANNOTATION


# --------------------------------------------------------------------------- the policy pack


@pytest.fixture
def good() -> dict[str, dict[str, Any]]:
    """The program's own backup objects for h200-ib (copies, to be made bad): the CronJobs by role,
    the bucket settings ConfigMap as `buckets`, the object store as `store`."""
    _, view = shipped("h200-ib")
    out = {
        r.name.rsplit("-", 1)[1]: copy.deepcopy(dict(r.inputs))
        for r in view.custom()
        if r.name.startswith("h200-ib-backups-cronjob-")
    }
    out["buckets"] = copy.deepcopy(dict(_named(view, "h200-ib-backups-bucket-settings").inputs))
    out["store"] = copy.deepcopy(dict(_named(view, "h200-ib-storage-object-store-checkpoints").inputs))
    return out


def _doc(cm: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(cm["data"]["buckets.json"]))


def _set_doc(cm: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    cm["data"] = {"buckets.json": json.dumps(doc)}
    return cm


def test_versioning_rule(good: dict[str, dict[str, Any]]) -> None:
    cm = good["buckets"]
    assert P.backup_buckets_versioned(CONFIG_MAP, cm) == []
    doc = _doc(cm)
    doc["buckets"][1]["versioning"] = "Suspended"
    doc["buckets"][0]["noncurrentVersionDays"] = 0
    assert P.backup_buckets_versioned(CONFIG_MAP, _set_doc(copy.deepcopy(cm), doc)) == [
        "bucket checkpoints: noncurrentVersionDays must be whole days >= 1 (got 0)",
        "bucket checkpoints-backup (backup): versioning 'Suspended', not 'Enabled'",
    ]
    doc = _doc(cm)
    doc["buckets"] = doc["buckets"][1:]
    assert P.backup_buckets_versioned(CONFIG_MAP, _set_doc(copy.deepcopy(cm), doc)) == [
        "bucket settings declare no checkpoint bucket"
    ]
    broken = {**cm, "data": {"buckets.json": "{"}}
    assert "is not JSON" in P.backup_buckets_versioned(CONFIG_MAP, broken)[0]
    assert P.backup_buckets_versioned(CONFIG_MAP, {"data": {"x": "y"}}) == []  # not a settings map


def test_no_public_access_rule(good: dict[str, dict[str, Any]]) -> None:
    cm = good["buckets"]
    assert P.backup_buckets_private(CONFIG_MAP, cm) == []
    doc = _doc(cm)
    doc["buckets"][0]["acl"] = "public-read"
    doc["buckets"][1]["policy"] = {
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": "s3:GetObject"}]
    }
    doc["buckets"][1]["keysFrom"] = ["AKIAABCDEFGHIJKLMNOP", "BACKUP_SECRET_KEY"]
    assert P.backup_buckets_private(CONFIG_MAP, _set_doc(copy.deepcopy(cm), doc)) == [
        "bucket checkpoints: ACL 'public-read' is not 'private'",
        "bucket checkpoints-backup: its policy allows everyone (s3:GetObject)",
        "bucket checkpoints-backup: keysFrom must name environment variables, not hold keys",
    ]
    # A key put into the settings by mistake is also caught by the existing credentials rule.
    assert P.credentials_only_in_secrets(CONFIG_MAP, _set_doc(copy.deepcopy(cm), doc))


def test_encryption_rule_is_honest_about_radosgw(good: dict[str, dict[str, Any]]) -> None:
    cm, store = good["buckets"], good["store"]
    assert P.backup_buckets_encrypted_where_supported([(CONFIG_MAP, cm), (STORE, store)]) == []
    vault = copy.deepcopy(store)
    vault["spec"]["security"] = {"s3": {"connectionDetails": {"KMS_PROVIDER": "vault"}}}
    assert P.backup_buckets_encrypted_where_supported([(CONFIG_MAP, cm), (STORE, vault)]) == [
        "bucket checkpoints: the object store has an SSE-S3 key backend: encrypt (AES256)",
        "bucket checkpoints-backup: the object store has an SSE-S3 key backend: encrypt (AES256)",
    ]
    doc = _doc(cm)
    for b in doc["buckets"]:
        b["encryption"] = "AES256"
    encrypted = _set_doc(copy.deepcopy(cm), doc)
    assert P.backup_buckets_encrypted_where_supported([(CONFIG_MAP, encrypted), (STORE, vault)]) == []
    assert P.backup_buckets_encrypted_where_supported([(CONFIG_MAP, encrypted), (STORE, store)])[0] == (
        "bucket checkpoints: SSE-S3 without an object store security.s3 key backend"
    )
    doc["backend"]["cephMajor"] = 16
    pacific = _set_doc(copy.deepcopy(cm), doc)
    assert P.backup_buckets_encrypted_where_supported([(CONFIG_MAP, pacific), (STORE, vault)])[0] == (
        "bucket checkpoints: Ceph 16 has no SSE-S3 bucket encryption (from Ceph 17)"
    )


def test_credentials_rule(good: dict[str, dict[str, Any]]) -> None:
    for role in ("settings", "dump", "verify"):
        assert P.backup_credentials_from_secrets(CRONJOB, good[role]) == [], role
    bad = copy.deepcopy(good["dump"])
    pod = bad["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    env[2] = {"name": "META_URL", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "metaurl"}}}
    env.append({"name": "BACKUP_SECRET_KEY", "value": "plain"})
    del pod["automountServiceAccountToken"]
    assert P.backup_credentials_from_secrets(CRONJOB, bad) == [
        "backup dump: dump env META_URL is not from a Secret (secretKeyRef)",
        "backup dump: dump env BACKUP_SECRET_KEY is not from a Secret (secretKeyRef)",
        "backup dump: the pod mounts a service account token it never uses",
    ]
    assert P.credentials_only_in_secrets(CRONJOB, bad)  # the literal key, by the older rule too


def test_rpo_rule(good: dict[str, dict[str, Any]]) -> None:
    dump = good["dump"]
    assert P.backup_interval_within_rpo(CRONJOB, dump) == []
    hourly = copy.deepcopy(dump)
    hourly["spec"]["schedule"] = "0 * * * *"
    assert P.backup_interval_within_rpo(CRONJOB, hourly) == [
        "backup dump schedule '0 * * * *' leaves up to 3600 s between dumps, longer than the declared RPO "
        "of 1800 s"
    ]
    uneven = copy.deepcopy(dump)
    uneven["spec"]["schedule"] = "0,10 * * * *"  # every 10 min, then a 50 min gap
    assert "up to 3000 s" in P.backup_interval_within_rpo(CRONJOB, uneven)[0]
    unjudged = copy.deepcopy(dump)
    unjudged["spec"]["schedule"] = "0 0 1 * *"
    assert "cannot be judged" in P.backup_interval_within_rpo(CRONJOB, unjudged)[0]
    no_rpo = copy.deepcopy(dump)
    no_rpo["metadata"]["annotations"] = {}
    assert "no numeric gpufleet.io/rpo-seconds" in P.backup_interval_within_rpo(CRONJOB, no_rpo)[0]
    assert P.backup_interval_within_rpo(CRONJOB, good["verify"]) == []  # only the dump is judged


def test_cron_gaps() -> None:
    assert P.cron_max_gap_seconds("*/15 * * * *") == 900
    assert P.cron_max_gap_seconds("0 10 * * 3") == 7 * 86400  # the weekly game-day
    assert P.cron_max_gap_seconds("30 1-5/2 * * *") == 20 * 3600  # 01:30, 03:30, 05:30
    assert P.cron_max_gap_seconds("0 0 * * 1-5") == 3 * 86400  # Friday to Monday
    for bad in ("* * *", "61 * * * *", "*/0 * * * *", "x * * * *", "0 0 1 * *"):
        assert P.cron_max_gap_seconds(bad) is None, bad


def test_a_stack_whose_rpo_misses_the_interval_fails_the_pack_before_it_gets_there() -> None:
    # The stack refuses it first (DrSpec); the pack is the guard for objects made another way.
    with pytest.raises(ValidationError, match="shorter than backupIntervalSeconds"):
        variant("h200-ib", lambda d: _dr(d, rpoSeconds=600))


# --------------------------------------------------------------------------- the jobs' program


def test_bucket_problems_read_from_what_the_store_reports() -> None:
    want = backup_jobs.BucketSetting.model_validate(
        {"name": "b", "role": "backup", "create": True, "keysFrom": ["A", "B"], "versioning": "Enabled",
         "noncurrentVersionDays": 7, "acl": "private", "encryption": "none"}
    )
    ok = backup_jobs.lifecycle_configuration(7)
    assert backup_jobs.bucket_problems({"Status": "Enabled"}, ok, {"Grants": []}, None, want) == []
    public = {"Grants": [{"Grantee": {"URI": backup_jobs.PUBLIC_GROUPS[0]}, "Permission": "READ"}]}
    policy = json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:*"}]})
    assert backup_jobs.bucket_problems({}, None, public, policy, want) == [
        "b: versioning is off, not Enabled",
        "b: no enabled rule expiring noncurrent versions after 7 days",
        "b: ACL grants READ to AllUsers",
        "b: bucket policy allows everyone (s3:*)",
    ]


def test_a_lifecycle_put_carries_a_content_md5() -> None:
    class Req:
        body = b"<LifecycleConfiguration/>"
        headers: dict[str, str] = {}

    r = Req()
    backup_jobs._add_content_md5(r)
    assert r.headers["Content-MD5"] == base64.b64encode(hashlib.md5(Req.body).digest()).decode()


def _redis(port_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(jfs.redis_server_argv(port, port_dir), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    ping = jfs.redis_cli(port, "PING")
    while subprocess.run(ping, capture_output=True, text=True).stdout.strip() != "PONG":
        assert time.monotonic() < deadline, "redis did not start"
        time.sleep(0.1)
    return proc, port


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A real JuiceFS volume (Redis metadata, local-file objects: `juicefs dump` reads only the
    engine) and an empty scratch Redis, as in the verify pod."""
    if shutil.which("redis-server") is None or shutil.which(jfs.juicefs_bin()) is None:
        pytest.skip("redis-server or juicefs (make venv, make apt) missing")
    live_dir, scratch_dir = tmp_path / "live", tmp_path / "scratch"
    live_dir.mkdir()
    scratch_dir.mkdir()
    live, live_port = _redis(live_dir)
    scratch, scratch_port = _redis(scratch_dir)
    try:
        meta = jfs.redis_url(live_port, 1)
        jfs.run([jfs.juicefs_bin(), "format", "--storage", "file", "--bucket", str(tmp_path / "objects"),
                 "--no-update", meta, "unit"])
        yield meta, jfs.redis_url(scratch_port, 1), tmp_path
    finally:
        for p in (live, scratch):
            p.terminate()
            p.wait(timeout=30)


def test_a_real_dump_is_proven_and_a_truncated_one_is_not(engines: tuple[str, str, Path]) -> None:
    meta, scratch, tmp = engines
    dump = tmp / "dump.json"
    jfs.run(jfs.dump_argv(meta, dump))
    dumped, reloaded, problems = backup_jobs.prove_dump(dump, scratch, tmp, previous_inodes=None)
    assert problems == [] and dumped is not None and reloaded == dumped
    # Half a dump: unreadable as JSON, so not a backup (and the scratch engine is not trusted either).
    half = tmp / "half.json"
    half.write_bytes(dump.read_bytes()[: dump.stat().st_size // 2])
    _, _, bad = backup_jobs.prove_dump(half, scratch, tmp, previous_inodes=None)
    assert bad and bad[0] == "the dump is not a readable JuiceFS dump"
    # A dump far smaller than the previous verified one: shrank sharply.
    _, _, shrank = backup_jobs.prove_dump(dump, scratch, tmp, previous_inodes=dumped.inodes * 10 + 10)
    assert any("shrank sharply" in p for p in shrank)
