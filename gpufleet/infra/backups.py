"""Backups as code for a real cluster: what the storage sandbox's backup processes do, as Kubernetes
objects (docs/storage.md "Backups as code", ADR 0060).

From the stack's `storage` and `dr` sections, in the namespace `gpufleet-backup`:
- a CephObjectStoreUser of its own (Rook writes its keys into a Secret there, which the Rook object
  store allows through `allowUsersInNamespaces`): the backup bucket's owner, so a JuiceFS client's
  keys cannot delete backups;
- a Secret with the JuiceFS metadata URL and the volume's S3 keys, all Pulumi secrets;
- the bucket settings (ConfigMap `gpufleet-bucket-settings`, no credential in it): the checkpoint
  bucket and the backup bucket versioned, noncurrent versions expired after `dr.noncurrentVersionDays`,
  private, and the encryption the backend can do;
- three CronJobs of `python -m gpufleet.infra.backup_jobs`: `buckets` applies those settings through
  the S3 API (create the backup bucket, PutBucketVersioning, PutBucketLifecycleConfiguration, a
  private ACL; each a PUT of the whole setting, so idempotent) and reads them back; `dump` runs
  `juicefs dump` every `dr.backupIntervalSeconds` into the backup bucket; `verify` proves the newest
  dump restorable in a scratch Redis beside it.

Why a CronJob of boto3 for the bucket settings and not a Pulumi dynamic provider: radosgw's endpoint
is a cluster Service, which the machine running `pulumi up` usually cannot reach, and the backup
user's keys exist only in a Secret Rook writes after the user is created, never in the stack or in
Pulumi's state; a CronJob reaches both, and applying them every hour puts back a setting someone
changed by hand (drift), which a provider would only notice on the next `pulumi refresh`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config.model import CephSpec, DrSpec, JuiceFsSpec, backup_cron
from gpufleet.infra.charts import CEPH_IMAGE, CHARTS, custom_resource
from gpufleet.infra.common import MANAGED_BY, child, secret_input

BACKUP_NAMESPACE = "gpufleet-backup"
BACKUP_USER = "gpufleet-backup"
JUICEFS_SECRET = "gpufleet-backup-juicefs"
SETTINGS_CONFIG_MAP = "gpufleet-bucket-settings"
SETTINGS_FILE = "buckets.json"
SETTINGS_DIR = "/etc/gpufleet/backup"
ROLE_LABEL = "gpufleet.io/backup"  # settings | dump | verify (the policy pack reads it)
SETTINGS_LABEL = "gpufleet.io/bucket-settings"
RPO_ANNOTATION = "gpufleet.io/rpo-seconds"
# Minute 17 of every hour: away from the top of the hour where other cluster CronJobs pile up.
SETTINGS_SCHEDULE = "17 * * * *"
# The scratch metadata engine: Redis 7.0, the major Debian 12 ships and the storage sandbox's
# verifier runs (docs/storage.md); an exact tag of the official image.
SCRATCH_REDIS_IMAGE = "docker.io/library/redis:7.0.15"
SCRATCH_REDIS_URL = "redis://127.0.0.1:6379/1"
NONROOT = 65532
# Environment names of the keys in the pods, each from a Secret (secretKeyRef).
ENV_BACKUP_KEYS = ("BACKUP_ACCESS_KEY", "BACKUP_SECRET_KEY")
ENV_CHECKPOINT_KEYS = ("CHECKPOINT_ACCESS_KEY", "CHECKPOINT_SECRET_KEY")
ENV_META_URL = "META_URL"


def rook_user_secret(store: str, user: str = BACKUP_USER) -> str:
    """The Secret Rook writes for a CephObjectStoreUser (keys AccessKey, SecretKey, Endpoint; Rook's
    "Object Store User" docs): `rook-ceph-object-user-<store>-<user>`."""
    return f"rook-ceph-object-user-{store}-{user}"


def checkpoint_bucket(js: JuiceFsSpec) -> str:
    """The JuiceFS volume's bucket: the first path segment of its path-style bucket URL."""
    name = urlsplit(js.bucket).path.strip("/").split("/")[0]
    if not name:
        raise ValueError(f"storage.juicefs.bucket {js.bucket!r} names no bucket in its path")
    return name


def backup_bucket(ceph: CephSpec) -> str:
    """The backup bucket, named as the storage sandbox names it: `<objectStore>-backup`."""
    assert ceph.object_store is not None
    return f"{ceph.object_store}-backup"


def rgw_endpoint(store: str) -> str:
    """The Service Rook makes for an object store's gateways (`rook-ceph-rgw-<store>`), on the
    gateway port the program sets (infra.storage.ceph_object_store_spec)."""
    return f"http://rook-ceph-rgw-{store}.{CHARTS['rook-ceph'].namespace}.svc:80"


def ceph_major(image: str = CEPH_IMAGE) -> int:
    """Ceph's major version from the image tag (`quay.io/ceph/ceph:v19.2.2` -> 19)."""
    return int(image.rsplit(":", 1)[1].lstrip("v").split(".")[0])


def bucket_encryption(major: int, kms: bool) -> str:
    """The default encryption the buckets can get: SSE-S3 (`AES256`) needs radosgw 17 or newer with
    its SSE-S3 key backend configured (Ceph "Encryption" docs: `rgw_crypt_sse_s3_backend`, Vault);
    Ceph 16 has no SSE-S3 and no bucket default encryption, only SSE-KMS and SSE-C per request.
    Without a KMS there is nothing to encrypt with: `none`."""
    return "AES256" if major >= 17 and kms else "none"


def bucket_settings(ceph: CephSpec, js: JuiceFsSpec, dr: DrSpec, kms: bool = False) -> dict[str, Any]:
    """What the `buckets` job applies and the policy pack checks: no credential, only where to find
    them (environment names filled from Secrets)."""
    enc = bucket_encryption(ceph_major(), kms)
    common = {
        "versioning": "Enabled",
        "noncurrentVersionDays": dr.noncurrent_version_days,
        "acl": "private",
        "encryption": enc,
    }
    return {
        "endpoint": rgw_endpoint(str(ceph.object_store)),
        "backend": {"kind": "ceph-rgw", "cephMajor": ceph_major(), "image": CEPH_IMAGE},
        "buckets": [
            {
                "name": checkpoint_bucket(js),
                "role": "checkpoint",
                "create": False,  # `juicefs format` made it, with the volume's keys (its owner)
                "keysFrom": list(ENV_CHECKPOINT_KEYS),
                **common,
            },
            {
                "name": backup_bucket(ceph),
                "role": "backup",
                "create": True,
                "keysFrom": list(ENV_BACKUP_KEYS),
                **common,
            },
        ],
    }


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def job_env(store: str, role: str) -> list[dict[str, Any]]:
    """Every credential from a Secret: the backup user's keys (Rook's Secret), and for the jobs
    that need them the JuiceFS volume's metadata URL and keys (the program's Secret)."""
    user = rook_user_secret(store)
    env = [
        _secret_env(ENV_BACKUP_KEYS[0], user, "AccessKey"),
        _secret_env(ENV_BACKUP_KEYS[1], user, "SecretKey"),
    ]
    if role == "settings":
        env += [
            _secret_env(ENV_CHECKPOINT_KEYS[0], JUICEFS_SECRET, "access-key"),
            _secret_env(ENV_CHECKPOINT_KEYS[1], JUICEFS_SECRET, "secret-key"),
        ]
    if role == "dump":
        env.append(_secret_env(ENV_META_URL, JUICEFS_SECRET, "metaurl"))
    return env


def _container(name: str, image: str, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "command": command,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def cronjob_spec(role: str, schedule: str, dr: DrSpec, store: str) -> dict[str, Any]:
    """A backup CronJob: `role` is settings, dump or verify (`python -m gpufleet.infra.backup_jobs
    <role>`). The verifier's pod runs an empty Redis as a native sidecar (an init container that
    keeps running), which the dump is loaded into."""
    main = _container(
        role,
        dr.job_image,
        ["python", "-m", "gpufleet.infra.backup_jobs", role, "--settings", f"{SETTINGS_DIR}/{SETTINGS_FILE}"],
    )
    main["env"] = job_env(store, role)
    if role == "verify":
        main["env"].append({"name": "SCRATCH_ENGINE_URL", "value": SCRATCH_REDIS_URL})
    main["volumeMounts"].append({"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True})
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": "default",
        "automountServiceAccountToken": False,  # the jobs speak S3, never to the API server
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT,
            "runAsGroup": NONROOT,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [main],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "settings", "configMap": {"name": SETTINGS_CONFIG_MAP}},
        ],
    }
    if role == "verify":
        redis = _container(
            "scratch-redis",
            SCRATCH_REDIS_IMAGE,
            # No persistence: each verification starts from an empty engine and leaves nothing.
            ["redis-server", "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no",
             "--dir", "/tmp"],
        )
        redis["restartPolicy"] = "Always"  # a native sidecar (Kubernetes 1.29+): ends with the pod
        redis["startupProbe"] = {"tcpSocket": {"port": 6379}, "periodSeconds": 1, "failureThreshold": 30}
        pod["initContainers"] = [redis]
    return {
        "schedule": schedule,
        "concurrencyPolicy": "Forbid",  # two dumps at once only double the engine's load
        "startingDeadlineSeconds": 600,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 5,
        "jobTemplate": {
            "spec": {
                "backoffLimit": 1,
                # A dump that outlives its interval would be overtaken by the next one anyway.
                "activeDeadlineSeconds": max(int(dr.backup_interval_seconds) * 2, 600),
                "template": {"metadata": {"labels": {**MANAGED_BY, ROLE_LABEL: role}}, "spec": pod},
            }
        },
    }


@dataclass(frozen=True)
class BackupsArgs:
    ceph: CephSpec
    juicefs: JuiceFsSpec
    dr: DrSpec
    after: tuple[pulumi.Resource, ...] = ()  # the object store the user belongs to
    protect: bool = True


class Backups(pulumi.ComponentResource):
    """Backups as code (module docstring)."""

    def __init__(self, name: str, args: BackupsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:storage:Backups", name, None, opts)
        ceph, js, dr = args.ceph, args.juicefs, args.dr
        store = str(ceph.object_store)
        ns = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata={
                "name": BACKUP_NAMESPACE,
                "labels": {**MANAGED_BY, "pod-security.kubernetes.io/enforce": "restricted"},
            },
            opts=pulumi.ResourceOptions.merge(
                child(self), pulumi.ResourceOptions(retain_on_delete=True)  # Rook's Secret lives there
            ),
        )
        namespace = ns.metadata.apply(lambda m: m.name)
        self.user = custom_resource(
            f"{name}-user",
            "ceph.rook.io/v1",
            "CephObjectStoreUser",
            {"name": BACKUP_USER, "namespace": BACKUP_NAMESPACE, "labels": MANAGED_BY},
            {
                "store": store,
                "clusterNamespace": CHARTS["rook-ceph"].namespace,
                "displayName": "gpufleet backups (metadata dumps, checkpoint copies)",
            },
            pulumi.ResourceOptions.merge(
                child(self, [ns, *args.after]),
                pulumi.ResourceOptions(protect=args.protect, retain_on_delete=True),
            ),
        )
        data = {
            "metaurl": secret_input(js.meta_url),
            **({"access-key": secret_input(js.access_key)} if js.access_key is not None else {}),
            **({"secret-key": secret_input(js.secret_key)} if js.secret_key is not None else {}),
        }
        secret = k8s.core.v1.Secret(
            f"{name}-juicefs",
            metadata={"name": JUICEFS_SECRET, "namespace": namespace, "labels": MANAGED_BY},
            string_data=data,
            opts=pulumi.ResourceOptions.merge(
                child(self), pulumi.ResourceOptions(additional_secret_outputs=["data", "stringData"])
            ),
        )
        self.settings = bucket_settings(ceph, js, dr)
        cm = k8s.core.v1.ConfigMap(
            f"{name}-bucket-settings",
            metadata={
                "name": SETTINGS_CONFIG_MAP,
                "namespace": namespace,
                "labels": {**MANAGED_BY, SETTINGS_LABEL: "true"},
            },
            data={SETTINGS_FILE: json.dumps(self.settings, indent=1, sort_keys=True)},
            opts=child(self),
        )
        schedule = backup_cron(dr.backup_interval_seconds)
        self.cronjobs: dict[str, k8s.batch.v1.CronJob] = {}
        for role, when in (("settings", SETTINGS_SCHEDULE), ("dump", schedule), ("verify", schedule)):
            annotations = {RPO_ANNOTATION: f"{dr.rpo_seconds:g}"} if role == "dump" else {}
            self.cronjobs[role] = k8s.batch.v1.CronJob(
                f"{name}-cronjob-{role}",
                metadata={
                    "name": f"gpufleet-backup-{role}",
                    "namespace": namespace,
                    "labels": {**MANAGED_BY, ROLE_LABEL: role},
                    "annotations": annotations,
                },
                spec=cronjob_spec(role, when, dr, store),
                opts=child(self, [secret, cm, *([self.user] if self.user is not None else [])]),
            )
        self.register_outputs(
            {
                "schedule": schedule,
                "buckets": [b["name"] for b in self.settings["buckets"]],
                "noncurrentVersionDays": dr.noncurrent_version_days,
            }
        )
