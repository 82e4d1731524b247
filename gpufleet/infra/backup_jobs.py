"""What the backup CronJobs of gpufleet.infra.backups run in the cluster:
`python -m gpufleet.infra.backup_jobs {settings|dump|verify} --settings buckets.json`.

- settings: each bucket of the settings file created when asked (the backup bucket), versioning
  Enabled, one lifecycle rule expiring noncurrent versions after N days, a private ACL; every one a
  PUT of the whole setting, so running it again changes nothing. Then read back, and the job fails
  when what the store reports differs (versioning not Enabled, no such rule, a grant to everyone, a
  bucket policy with a public principal).
- dump: `juicefs dump` of the metadata engine (META_URL) to the backup bucket, under the same keys
  the storage sandbox uses (core.juicefs.dump_key), so a restore (core.juicefs_backups.restore_newest)
  reads either.
- verify: the newest dump without evidence loaded into the pod's own empty Redis (SCRATCH_ENGINE_URL)
  and dumped again; judged by core.juicefs.judge_dump (same files and inodes after the reload, no
  sharp shrink against the previous verified dump). The evidence is written beside the dump whatever
  the verdict; the job fails on a failed verdict so the cluster's Job-failed alerts see it. Unlike
  the sandbox, the cluster job has no mount to read the live file system's inode count from, so that
  one check is not made here.

Keys come only from the environment, which the CronJobs fill from Secrets (secretKeyRef).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.core import juicefs as jfs
from gpufleet.core import s3
from gpufleet.core.juicefs_backups import list_evidence

PUBLIC_GROUPS = (
    "http://acs.amazonaws.com/groups/global/AllUsers",
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers",
)
LIFECYCLE_RULE_ID = "gpufleet-noncurrent-versions"


class BucketSetting(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    role: Literal["checkpoint", "backup"]
    create: bool
    keys_from: tuple[str, str] = Field(alias="keysFrom")  # environment names of the two keys
    versioning: Literal["Enabled"]
    noncurrent_version_days: int = Field(alias="noncurrentVersionDays", ge=1)
    acl: Literal["private"]
    encryption: Literal["none", "AES256"]


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: str
    backend: dict[str, Any]
    buckets: list[BucketSetting]

    def of_role(self, role: str) -> BucketSetting:
        return next(b for b in self.buckets if b.role == role)


def lifecycle_configuration(days: int) -> dict[str, Any]:
    """One rule for the whole bucket: a version stops being current (overwritten or deleted) and
    is expired `days` later. Current objects are never expired by it."""
    return {
        "Rules": [
            {
                "ID": LIFECYCLE_RULE_ID,
                "Status": "Enabled",
                "Filter": {"Prefix": ""},
                "NoncurrentVersionExpiration": {"NoncurrentDays": days},
            }
        ]
    }


def _add_content_md5(request: Any, **_: Any) -> None:
    """PutBucketLifecycleConfiguration requires an integrity header; botocore 1.36+ sends a CRC32
    trailer instead of Content-MD5, which Ceph 16's radosgw does not know (the same change that
    breaks its uploads, docs/storage.md "boto3 against Ceph 16"); an MD5 of the body satisfies both."""
    body = request.body or b""
    if isinstance(body, str):
        body = body.encode()
    if "Content-MD5" not in request.headers:
        request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def client_for(settings: Settings, bucket: BucketSetting, env: dict[str, str]) -> Any:
    access, secret = (env.get(k) for k in bucket.keys_from)
    if not access or not secret:
        raise SystemExit(f"bucket {bucket.name}: {' and '.join(bucket.keys_from)} must be set (from Secrets)")
    c = s3.client(settings.endpoint, access, secret)
    c.meta.events.register("before-sign.s3.PutBucketLifecycleConfiguration", _add_content_md5)
    return c


def apply_bucket(client: Any, b: BucketSetting) -> None:
    """Every setting as one whole PUT: idempotent."""
    if b.create:
        try:
            client.head_bucket(Bucket=b.name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
            client.create_bucket(Bucket=b.name)
    client.put_bucket_versioning(Bucket=b.name, VersioningConfiguration={"Status": b.versioning})
    client.put_bucket_lifecycle_configuration(
        Bucket=b.name, LifecycleConfiguration=lifecycle_configuration(b.noncurrent_version_days)
    )
    client.put_bucket_acl(Bucket=b.name, ACL=b.acl)
    if b.encryption != "none":
        client.put_bucket_encryption(
            Bucket=b.name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": b.encryption}}]
            },
        )


def bucket_problems(
    versioning: dict[str, Any], lifecycle: dict[str, Any] | None, acl: dict[str, Any], policy: str | None,
    want: BucketSetting,
) -> list[str]:
    """What a bucket's settings, as the store reports them, lack against `want` (pure)."""
    out = []
    if versioning.get("Status") != "Enabled":
        out.append(f"{want.name}: versioning is {versioning.get('Status') or 'off'}, not Enabled")
    rules = (lifecycle or {}).get("Rules") or []
    days = [
        r.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays")
        for r in rules
        if r.get("Status") == "Enabled"
    ]
    if want.noncurrent_version_days not in days:
        out.append(f"{want.name}: no enabled rule expiring noncurrent versions after "
                   f"{want.noncurrent_version_days} days")
    for g in acl.get("Grants") or []:
        uri = (g.get("Grantee") or {}).get("URI")
        if uri in PUBLIC_GROUPS:
            out.append(f"{want.name}: ACL grants {g.get('Permission')} to {uri.rsplit('/', 1)[1]}")
    if policy:
        for st in json.loads(policy).get("Statement") or []:
            principal = st.get("Principal")
            if st.get("Effect") == "Allow" and (principal == "*" or (isinstance(principal, dict)
                                                                    and "*" in principal.values())):
                out.append(f"{want.name}: bucket policy allows everyone ({st.get('Action')})")
    return out


def read_back(client: Any, b: BucketSetting) -> list[str]:
    versioning = client.get_bucket_versioning(Bucket=b.name)
    try:
        lifecycle = client.get_bucket_lifecycle_configuration(Bucket=b.name)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
            raise
        lifecycle = None
    acl = client.get_bucket_acl(Bucket=b.name)
    try:
        policy = client.get_bucket_policy(Bucket=b.name).get("Policy")
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("NoSuchBucketPolicy", "NoSuchKey"):
            raise
        policy = None
    return bucket_problems(versioning, lifecycle, acl, policy, b)


def take_dump(meta_url: str, client: Any, bucket: str, work: Path) -> str:
    """`juicefs dump` (without the S3 secret) uploaded to the backup bucket; its key."""
    key = jfs.dump_key(time.time())
    out = work / "dump.json"
    out.unlink(missing_ok=True)
    jfs.run(jfs.dump_argv(meta_url, out))
    client.upload_file(str(out), bucket, key, Config=s3.transfer_config())
    return key


def prove_dump(
    dump: Path, scratch_url: str, work: Path, previous_inodes: int | None
) -> tuple[jfs.DumpCounts | None, jfs.DumpCounts | None, list[str]]:
    """Load `dump` into the (empty) scratch engine, dump it again, and judge: (dump's counts, the
    reload's counts, problems; none means proven restorable)."""
    try:
        dumped: jfs.DumpCounts | None = jfs.count_dump(json.loads(dump.read_text()))
    except (OSError, ValueError):
        dumped = None
    reloaded, load_error = None, None
    again = work / "reloaded.json"
    again.unlink(missing_ok=True)
    try:
        jfs.run(jfs.load_argv(scratch_url, dump))
        jfs.run(jfs.dump_argv(scratch_url, again))
        reloaded = jfs.count_dump(json.loads(again.read_text()))
    except jfs.JuiceFsError as e:
        load_error = str(e)
    except (OSError, ValueError) as e:
        load_error = f"the scratch engine's dump is unreadable: {e}"
    return dumped, reloaded, jfs.judge_dump(dumped, reloaded, None, previous_inodes, load_error)


def unverified_dumps(client: Any, bucket: str) -> list[str]:
    """Dump keys without evidence beside them, oldest first (keys sort by time)."""
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=jfs.METADATA_PREFIX):
        keys.update(str(o["Key"]) for o in page.get("Contents", []))
    return sorted(k for k in keys if k.endswith(".json") and not k.endswith(jfs.EVIDENCE_SUFFIX)
                  and jfs.evidence_key(k) not in keys)


def verify_newest(client: Any, bucket: str, scratch_url: str, work: Path) -> jfs.DumpEvidence | None:
    """Prove the newest unverified dump (None when every dump has its evidence already)."""
    pending = unverified_dumps(client, bucket)
    if not pending:
        return None
    key, t0 = pending[-1], time.monotonic()
    previous = jfs.newest_verified(list_evidence(client, bucket))
    path = work / "verify.json"
    client.download_file(bucket, key, str(path))
    dumped, reloaded, problems = prove_dump(path, scratch_url, work, previous.inodes if previous else None)
    status = client.get_bucket_versioning(Bucket=bucket).get("Status")
    if status != "Enabled":  # an unversioned backup bucket loses what a delete or overwrite hits
        problems.append(f"the backup bucket's versioning is {status or 'off'}")
    taken_at = int(key.rsplit("-", 1)[1].split(".")[0]) / 1000
    evidence = jfs.evidence_of(key, taken_at, time.monotonic() - t0, dumped, reloaded, previous, problems)
    client.put_object(Bucket=bucket, Key=jfs.evidence_key(key), Body=evidence.model_dump_json().encode())
    return evidence


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpufleet-backup-job", description=__doc__)
    p.add_argument("role", choices=["settings", "dump", "verify"])
    p.add_argument("--settings", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        settings = Settings.model_validate_json(args.settings.read_text())
    except (OSError, ValidationError) as e:
        print(f"{args.settings}: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            if args.role == "settings":
                problems = []
                for b in settings.buckets:
                    c = client_for(settings, b, env)
                    apply_bucket(c, b)
                    problems += read_back(c, b)
                for line in problems:
                    print(line, file=sys.stderr)
                print(json.dumps({"buckets": [b.name for b in settings.buckets], "problems": problems}))
                return 1 if problems else 0
            backup = settings.of_role("backup")
            c = client_for(settings, backup, env)
            if args.role == "dump":
                meta = env.get("META_URL")
                if not meta:
                    print("META_URL must be set (from the JuiceFS Secret)", file=sys.stderr)
                    return 2
                print(json.dumps({"dump": take_dump(meta, c, backup.name, work)}))
                return 0
            scratch = env.get("SCRATCH_ENGINE_URL", "redis://127.0.0.1:6379/1")
            evidence = verify_newest(c, backup.name, scratch, work)
            print(evidence.model_dump_json() if evidence else json.dumps({"verified": "nothing new"}))
            return 0 if evidence is None or evidence.verified else 1
    except (ClientError, BotoCoreError, jfs.JuiceFsError) as e:
        print(f"{args.role}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
