"""The storage sandbox's public interface: the state file `gpufleet sandbox up --storage` writes.

A real Ceph cluster (monitor, manager, OSDs on BlueStore, radosgw) on loopback, started by the
project from Debian's packages (gpufleet.sandbox.storage). Chaos actions, probes, backups and
drills reach it only through this file: the Ceph configuration and admin keyring it names (for the
`ceph` command), the radosgw endpoint and the S3 credentials file (for boto3), the buckets, and
every daemon with the Launch recipe a rollback restarts it from.

Location: `<state_root>/<stack>/storage/state.json`, beside the Slurm sandbox's state file and the
Kubernetes sandbox's folder, so each runs and is removed on its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.sandbox_contract import SandboxProcess, state_root

STORAGE_STATE_DIR = "storage"
# In the backup bucket: checkpoint copies under BACKUP_PREFIX, the evidence of each verified copy
# under EVIDENCE_PREFIX (gpufleet.sandbox.storage.backup writes them; restores and drills read them).
BACKUP_PREFIX = "checkpoints/"
EVIDENCE_PREFIX = "evidence/"
# Beside the run's files: the events (JSON lines) of the checkpoint writer, the backup job and restores.
WORKLOAD_DIR = "workload"
# The JuiceFS processes' names among StorageSandboxState.processes.
JUICEFS_REDIS = "redis"
JUICEFS_SCRATCH = "redis-scratch"
JUICEFS_MOUNT = "juicefs-mount"


def storage_state_path(stack: str, root: Path | None = None) -> Path:
    return (root or state_root()) / stack / STORAGE_STATE_DIR / "state.json"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OsdRecord(_M):
    id: int
    uuid: str
    data_dir: str  # BlueStore's folder: keyring, fsid, the `block` file
    block: str  # the sparse file BlueStore uses as its device
    block_bytes: int


class S3Credentials(_M):
    """The radosgw user's keys (file mode 0600, named by StorageSandboxState.s3_credentials)."""

    access_key: str
    secret_key: str


class JuiceFsRecord(_M):
    """The storage sandbox's JuiceFS (gpufleet.sandbox.storage.juicefs): a Redis metadata engine on
    loopback, radosgw as the object store, mounted under the run directory; and a scratch Redis
    where each metadata dump is loaded to prove it restorable."""

    name: str  # the volume's name (`juicefs format ... <name>`)
    meta_url: str  # redis://127.0.0.1:<port>/<db>
    meta_port: int
    meta_db: int
    meta_dir: str  # Redis's data folder (its append-only file): what metadata-engine-loss wipes
    scratch_port: int  # the scratch Redis the backups are loaded into
    bucket: str  # the volume's bucket on radosgw
    mountpoint: str
    cache_dir: str
    cache_mib: int
    metrics: str  # host:port of the mount's Prometheus metrics
    checkpoint_dir: str | None = None  # under the mount, when the stack checkpoints to JuiceFS


class StorageSandboxState(_M):
    version: Literal[1] = 1
    stack: str
    run_id: str
    phase: Literal["creating", "up", "deleting", "failed"]
    base_dir: str  # run directory: configuration, keyrings, daemon data, OSD block files, logs
    created_at: float
    ceph_version: str | None = None  # `ceph --version` of the programs started
    fsid: str | None = None
    ceph_conf: str | None = None  # `ceph -c <this>` reaches the cluster as client.admin
    # mon-v1, mon-v2, rgw, mgr-prometheus, blackbox, prometheus: all on 127.0.0.1
    ports: dict[str, int] = Field(default_factory=dict)
    pool_size: int | None = None  # replicas of every pool (osd_pool_default_size)
    pool_min_size: int | None = None
    osds: list[OsdRecord] = Field(default_factory=list)
    processes: list[SandboxProcess] = Field(default_factory=list)  # names: ceph-mon.a, ceph-osd.0, ...
    s3_endpoint: str | None = None  # http://127.0.0.1:<port> (radosgw, path-style addressing)
    s3_credentials: str | None = None  # JSON S3Credentials, mode 0600
    checkpoint_bucket: str | None = None
    backup_bucket: str | None = None  # versioned; backups and their restore evidence
    # Prometheus on 127.0.0.1 with the catalog's rules over ceph-mgr's exporter and a blackbox
    # probe of radosgw (gpufleet.sandbox.storage.monitoring).
    prometheus_url: str | None = None
    juicefs: JuiceFsRecord | None = None  # when the stack has storage.juicefs

    def process(self, name: str) -> SandboxProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(
            f"no process {name!r} in the storage sandbox of {self.stack}; "
            f"processes: {[p.name for p in self.processes]}"
        )

    def ceph_command(self, *args: str) -> list[str]:
        """argv of a `ceph` admin command against this cluster (JSON output)."""
        if self.ceph_conf is None:
            raise RuntimeError("this storage sandbox has no Ceph configuration yet")
        return ["ceph", "-c", self.ceph_conf, "--connect-timeout", "10", "--format", "json", *args]

    def events_file(self, name: str) -> Path:
        """The events file (JSON lines) of `checkpoint-writer`, `backup` or `restore`."""
        return Path(self.base_dir) / WORKLOAD_DIR / f"{name}.jsonl"

    def credentials(self) -> S3Credentials:
        if self.s3_credentials is None:
            raise RuntimeError("this storage sandbox has no S3 user yet")
        return S3Credentials.model_validate_json(Path(self.s3_credentials).read_text())


def read_storage_state(stack: str, root: Path | None = None) -> StorageSandboxState:
    raw = json.loads(storage_state_path(stack, root).read_text())
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != 1:
        raise ValueError(
            f"storage sandbox state file version {version!r}, this gpufleet reads version 1: stop it "
            "with the gpufleet version that made it (`gpufleet sandbox down --storage`)"
        )
    return StorageSandboxState.model_validate(raw)


def write_storage_state(state: StorageSandboxState, root: Path | None = None) -> Path:
    """Atomically replace the storage sandbox's state file (write, fsync, rename)."""
    path = storage_state_path(state.stack, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(state.model_dump_json(indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
