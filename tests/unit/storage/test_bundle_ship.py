"""Diagnostic bundles shipped off the node (fleet.bundle.ship): the archive uploaded, read back and
checked by sha256 before its evidence is written; a copy that does not read back whole is never
vouched for; the hook refuses a bad target file before collecting; the sandbox's health check passes
the target when there is one. S3 is an in-memory double here; tests/e2e/test_s3_job.py ships to
radosgw from a node's namespace."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

from memory_s3 import MemoryS3

from gpufleet.core.s3 import S3Location
from gpufleet.fleet.bundle import hook
from gpufleet.fleet.bundle.archive import members, write_bundle
from gpufleet.fleet.bundle.model import Caps, Manifest
from gpufleet.fleet.bundle.runner import Collector, Output
from gpufleet.fleet.bundle.ship import ship

CAPS = Caps(collector_timeout_s=5, collector_bytes=1000, total_bytes=5000, deadline_s=10)
TARGET = S3Location(endpoint="http://127.0.0.1:7480", bucket="backups", prefix="bundles/", access_key="AK",
                    secret_key="SK")


def _bundle(tmp_path: Path) -> tuple[Path, Manifest]:
    records, files = members([Collector("agent", "agent.json", ["GET /state"])],
                             {"agent": Output(b'{"xid": 79}', "ok", 0, 0.1)}, CAPS)
    manifest = Manifest(node="gpu-2", stack="sandbox", source="sandbox", trigger="node-health",
                        reason="xid 79", started_at=1_765_000_000.0, finished_at=1_765_000_001.0, caps=CAPS,
                        members=records)
    return write_bundle(tmp_path, manifest, files), manifest


def test_a_bundle_is_shipped_archive_first_read_back_then_vouched_for(tmp_path: Path) -> None:
    s3 = MemoryS3(buckets=("backups",))
    path, manifest = _bundle(tmp_path)
    got = ship(s3, TARGET, path, manifest)
    key = f"bundles/gpu-2/{path.name}"
    assert got["verified"] is True and got["url"] == f"s3://backups/{key}"
    assert s3.puts == [key, key + ".json"]  # the evidence after the archive
    assert s3.objects[("backups", key)] == path.read_bytes()
    evidence = json.loads(s3.objects[("backups", key + ".json")])
    assert evidence["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() == got["sha256"]
    assert evidence["manifest"]["node"] == "gpu-2" and evidence["manifest"]["reason"] == "xid 79"


class _Torn(MemoryS3):
    """A store that keeps only part of what it is sent (a cut-off upload that still answered 200)."""

    def upload_file(self, filename: str, bucket: str, key: str) -> None:
        self.put_object(Bucket=bucket, Key=key, Body=Path(filename).read_bytes()[:-10])


def test_a_copy_that_does_not_read_back_whole_is_never_vouched_for(tmp_path: Path) -> None:
    s3 = _Torn(buckets=("backups",))
    path, manifest = _bundle(tmp_path)
    got = ship(s3, TARGET, path, manifest)
    assert got["verified"] is False and "read back with sha256" in got["problem"]
    assert not [k for _, k in s3.objects if k.endswith(".json")]


def test_a_store_that_does_not_answer_is_reported_not_raised(tmp_path: Path) -> None:
    s3 = MemoryS3(buckets=())  # the bucket is gone
    path, manifest = _bundle(tmp_path)
    got = ship(s3, TARGET, path, manifest)
    assert got["verified"] is False and "NoSuchBucket" in got["problem"]


def test_the_hook_refuses_a_bad_target_file_before_collecting(tmp_path: Path) -> None:
    bad = tmp_path / "ship.json"
    bad.write_text(json.dumps({"endpoint": "http://127.0.0.1:7480", "bucket": "b"}))
    out, err = io.StringIO(), io.StringIO()
    base = ["--state-file", str(tmp_path / "missing.json"), "--node", "gpu-2", "--out", str(tmp_path / "o")]
    rc = hook.run([*base, "--ship-to", str(bad)], out, err)
    assert rc == 2 and f"--ship-to {bad}" in err.getvalue() and "access_key" in err.getvalue()
    assert not (tmp_path / "o").exists()
    rc = hook.run([*base, "--ship-to", str(tmp_path / "absent.json")], out, err)
    assert rc == 2 and "No such file" in err.getvalue()


def test_the_sandboxs_health_check_ships_when_the_storage_sandbox_is_up(tmp_path: Path) -> None:
    from dataclasses import replace

    from gpufleet.config.load import load_named_stack
    from gpufleet.sandbox import configs
    from gpufleet.sandbox.layout import plan_layout

    layout = plan_layout("sandbox-storage", load_named_stack("sandbox-storage"), "abc123", Path("/run/gf/x"))
    without = configs.health_script(layout, Path("/venv/bin/gpufleet"))
    assert "-m gpufleet.fleet.bundle" in without and "--ship-to" not in without
    shipping: Any = replace(layout, bundle_ship=Path("/run/gf/x/bundles/ship.json"))
    text = configs.health_script(shipping, Path("/venv/bin/gpufleet"))
    assert "--out /run/gf/x/bundles --ship-to /run/gf/x/bundles/ship.json --node $node" in text
