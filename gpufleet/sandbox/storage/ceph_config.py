"""What a sandbox Ceph cluster is made of, decided before anything starts: pure functions.

The cluster follows Ceph's "Manual Deployment" procedure (docs.ceph.com, Pacific: monitor
bootstrap, then OSDs "long form", then radosgw), without cephadm or containers: one monitor, one
manager, N OSDs on BlueStore over sparse files, one radosgw, all on 127.0.0.1 with ports chosen
at bring-up, every file under the run directory.

Sizes come from the stack's storage section (`storage.ceph.pools[].replicas`): the pools get that
many replicas, and the sandbox runs one OSD more than that, so an OSD lost for good can be
re-replicated (drill 4). All OSDs share one host, so the CRUSH failure domain is the OSD
(`osd_crush_chooseleaf_type = 0`).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError, Problem

MON_ID = "a"
MGR_ID = "x"
RGW_NAME = "client.rgw.gw"
ADMIN = "client.admin"
# Ceph's minimum for osd_memory_target is 896 MiB (the option's documented minimum, Pacific
# "osd_memory_target"); the OSD trims its caches towards it. Idle OSDs use far less.
OSD_MEMORY_TARGET = 896 * 1024 * 1024
# Ceph sleeps osd_recovery_sleep_hdd (0.1 s, Pacific's default) between recovery and backfill ops on
# a rotational device, to spare client I/O on spinning disks; on SSDs the sleep is 0
# (osd_recovery_sleep_ssd). The OSDs' block files sit on this machine's virtual disk, which reports
# itself rotational, while the clusters the sandbox stands for keep checkpoints on flash. With the HDD
# sleep, one OSD marked down under the checkpoint writer left PGs backfilling for 118 s (2026-12-06,
# seed 20261205; a CI run's thrash timed out at 120 s on it); without it every change of the same
# thrash was clean within 12 s.
OSD_RECOVERY_SLEEP_HDD_S = 0.0
# Each OSD's BlueStore device: a sparse file; only what is written takes disk space.
OSD_BLOCK_BYTES = 4 * 1024**3
# Placement groups per pool: radosgw creates ~7 pools, so 8 PGs each keeps every OSD far below
# mon_max_pg_per_osd (250 in Pacific) with 3 OSDs.
PG_PER_POOL = 8
# The monitor warns (MON_DISK_LOW) when its file system has less than mon_data_avail_warn percent
# free (default 30); a developer machine's disk is often fuller than that while holding plenty
# of room for a sandbox (the OSDs are a few GiB at most).
MON_AVAIL_WARN_PERCENT = 5
MAX_REPLICAS = 4  # more OSDs than 5 on one small machine buys nothing but memory

# Capabilities of each entity (Ceph "User Management": profiles for daemons).
CAPS: dict[str, dict[str, str]] = {
    "mon.": {"mon": "allow *"},
    ADMIN: {"mon": "allow *", "mgr": "allow *", "osd": "allow *", "mds": "allow *"},
    f"mgr.{MGR_ID}": {"mon": "allow profile mgr", "osd": "allow *", "mds": "allow *"},
    RGW_NAME: {"mon": "allow rw", "osd": "allow rwx", "mgr": "allow rw"},
}
OSD_CAPS = {"mon": "allow profile osd", "mgr": "allow profile osd", "osd": "allow *"}


@dataclass(frozen=True)
class CephPlan:
    """The cluster's shape, from the stack."""

    osds: int
    pool_size: int
    pool_min_size: int
    object_store: str  # the checkpoint bucket's name
    backup_bucket: str


def plan_ceph(stack_name: str, spec: StackSpec) -> CephPlan:
    """InputError (naming the stack file's paths) when the stack cannot be realised as a sandbox."""
    ceph = spec.storage.ceph
    if ceph is None:
        raise InputError(
            f"stack {stack_name}",
            [Problem("storage.ceph", "the storage sandbox realises storage.ceph; this stack has none")],
        )
    problems = []
    if ceph.object_store is None:
        problems.append(Problem("storage.ceph.objectStore", "the storage sandbox needs an object store name"))
    replicas = max(p.replicas for p in ceph.pools)
    if replicas > MAX_REPLICAS:
        problems.append(
            Problem("storage.ceph.pools", f"{replicas} replicas; the sandbox runs at most {MAX_REPLICAS}")
        )
    if problems:
        raise InputError(f"stack {stack_name}", problems)
    assert ceph.object_store is not None
    return CephPlan(
        osds=replicas + 1,
        pool_size=replicas,
        # Writes go on with one copy lost (Ceph's default min_size is size - size/2).
        pool_min_size=max(1, replicas - replicas // 2),
        object_store=ceph.object_store,
        backup_bucket=f"{ceph.object_store}-backup",
    )


@dataclass(frozen=True)
class CephPaths:
    base: Path  # the run directory

    @property
    def conf(self) -> Path:
        return self.base / "ceph.conf"

    @property
    def keys(self) -> Path:
        return self.base / "keys"

    def keyring(self, entity: str) -> Path:
        return self.keys / f"{entity}.keyring"

    @property
    def monmap(self) -> Path:
        return self.base / "monmap"

    def mon_data(self) -> Path:
        return self.base / "mon" / MON_ID

    def mgr_data(self) -> Path:
        return self.base / "mgr" / MGR_ID

    def osd_data(self, osd: int) -> Path:
        return self.base / "osd" / str(osd)

    def log(self, name: str) -> Path:
        return self.base / "log" / f"{name}.out"

    @property
    def s3_credentials(self) -> Path:
        return self.base / "s3-credentials.json"


def ceph_key(secret: bytes, created_s: int) -> str:
    """A cephx key as Ceph writes it: base64 of (type AES = 1, created sec, nsec, length 16, the
    16-byte secret), little-endian (CryptoKey::encode, src/auth/Crypto.cc)."""
    if len(secret) != 16:
        raise ValueError("a cephx AES secret has 16 bytes")
    return base64.b64encode(struct.pack("<HIIH", 1, created_s, 0, 16) + secret).decode()


def render_keyring(entries: Mapping[str, tuple[str, Mapping[str, str]]]) -> str:
    """Keyring file text: entity -> (key, caps by service)."""
    out = []
    for entity, (key, caps) in entries.items():
        out.append(f"[{entity}]\n\tkey = {key}\n")
        out.extend(f'\tcaps {svc} = "{cap}"\n' for svc, cap in sorted(caps.items()))
    return "".join(out)


def mon_addrs(ports: Mapping[str, int]) -> str:
    """The monitor's address vector: messenger v2 and v1 on loopback."""
    return f"[v2:127.0.0.1:{ports['mon-v2']},v1:127.0.0.1:{ports['mon-v1']}]"


def render_conf(fsid: str, paths: CephPaths, ports: Mapping[str, int], plan: CephPlan) -> str:
    """ceph.conf for the run. Every path is inside the run directory ($name and $id are Ceph's own
    metavariables, expanded by each daemon)."""
    b = paths.base
    return f"""# Written by gpufleet (gpufleet.sandbox.storage): a sandbox cluster on 127.0.0.1.
[global]
fsid = {fsid}
mon_initial_members = {MON_ID}
mon_host = {mon_addrs(ports)}
public_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
keyring = {paths.keys}/$name.keyring
run_dir = {b}/run
admin_socket = {b}/run/$name.asok
log_file = {b}/log/$name.log
log_to_stderr = false
err_to_stderr = true
mon_data = {b}/mon/$id
mgr_data = {b}/mgr/$id
osd_data = {b}/osd/$id
mon_data_avail_warn = {MON_AVAIL_WARN_PERCENT}
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = {"false" if plan.pool_size == 1 else "true"}
osd_pool_default_size = {plan.pool_size}
osd_pool_default_min_size = {plan.pool_min_size}
osd_pool_default_pg_num = {PG_PER_POOL}
osd_pool_default_pgp_num = {PG_PER_POOL}
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = {OSD_BLOCK_BYTES}
bluestore_block_db_create = false
bluestore_block_wal_create = false
osd_memory_target = {OSD_MEMORY_TARGET}
osd_recovery_sleep_hdd = {OSD_RECOVERY_SLEEP_HDD_S:g}

[mon]
# `ceph-mon --mkfs` keeps the monitor's own key in its data folder.
keyring = $mon_data/keyring

[{RGW_NAME}]
rgw_frontends = beast endpoint=127.0.0.1:{ports["rgw"]}
rgw_data = {b}/rgw
"""
