"""The storage sandbox's Ceph plan and configuration, decided before anything starts."""

from __future__ import annotations

import base64
import configparser
import struct
from pathlib import Path

import pytest

from gpufleet.config.load import load_named_stack
from gpufleet.config.model import CephPool, CephSpec
from gpufleet.core.errors import InputError
from gpufleet.sandbox.storage.ceph_config import (
    OSD_BLOCK_BYTES,
    CephPaths,
    ceph_key,
    plan_ceph,
    render_conf,
    render_keyring,
)

STACKS = Path(__file__).parents[3] / "stacks"


def test_the_plan_follows_the_stacks_storage_section() -> None:
    spec = load_named_stack("sandbox-storage", STACKS)
    plan = plan_ceph("sandbox-storage", spec)
    assert (plan.osds, plan.pool_size, plan.pool_min_size) == (3, 2, 1)  # one OSD more than replicas
    assert (plan.object_store, plan.backup_bucket) == ("checkpoints", "checkpoints-backup")
    three = spec.model_copy(update={"storage": spec.storage.model_copy(update={
        "ceph": CephSpec(mons=1, mgrs=1, pools=[CephPool(name="p", replicas=3, failure_domain="osd")])})})
    assert (plan_ceph("x", three).osds, plan_ceph("x", three).pool_min_size) == (4, 2)


def test_a_stack_without_ceph_is_refused_with_its_path() -> None:
    spec = load_named_stack("sandbox", STACKS)
    with pytest.raises(InputError, match=r"storage\.ceph: the storage sandbox realises storage\.ceph"):
        plan_ceph("sandbox", spec)
    six = CephSpec(mons=1, pools=[CephPool(name="p", replicas=6, failure_domain="osd")], object_store=None)
    big = spec.model_copy(update={"storage": spec.storage.model_copy(update={"ceph": six})})
    with pytest.raises(InputError) as e:
        plan_ceph("big", big)
    assert [p.path for p in e.value.problems] == ["storage.ceph.objectStore", "storage.ceph.pools"]


def test_a_cephx_key_has_cephs_encoding() -> None:
    key = ceph_key(bytes(range(16)), 1_700_000_000)
    raw = base64.b64decode(key)
    assert key.startswith("AQ") and len(key) == 40  # what ceph-authtool --gen-print-key prints
    assert struct.unpack("<HIIH", raw[:12]) == (1, 1_700_000_000, 0, 16) and raw[12:] == bytes(range(16))
    with pytest.raises(ValueError):
        ceph_key(b"short", 0)


def test_keyring_and_conf_render(tmp_path: Path) -> None:
    text = render_keyring({"osd.0": ("AQkey==", {"osd": "allow *", "mon": "allow profile osd"})})
    assert text == '[osd.0]\n\tkey = AQkey==\n\tcaps mon = "allow profile osd"\n\tcaps osd = "allow *"\n'
    spec = load_named_stack("sandbox-storage", STACKS)
    paths = CephPaths(tmp_path)
    conf = render_conf("f00", paths, {"mon-v1": 7001, "mon-v2": 7002, "rgw": 7003}, plan_ceph("s", spec))
    parsed = configparser.ConfigParser(interpolation=None)
    parsed.read_string(conf)
    g = parsed["global"]
    assert g["mon_host"] == "[v2:127.0.0.1:7002,v1:127.0.0.1:7001]"
    assert (g["osd_pool_default_size"], g["osd_pool_default_min_size"]) == ("2", "1")
    assert g["osd_crush_chooseleaf_type"] == "0"  # every OSD on one host: replicas across OSDs
    assert int(g["bluestore_block_size"]) == OSD_BLOCK_BYTES
    assert g["keyring"] == f"{tmp_path}/keys/$name.keyring"
    assert all(v.startswith(str(tmp_path)) for k, v in g.items() if k.endswith(("_data", "_dir", "_file")))
    assert parsed["mon"]["keyring"] == "$mon_data/keyring"
    assert parsed["client.rgw.gw"]["rgw_frontends"] == "beast endpoint=127.0.0.1:7003"
