"""JuiceFS in the storage sandbox: the plan from the stack, the commands, what proves a metadata dump
a backup, which dump a restore takes, and checkpoints on a mounted file system (a tmp folder here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.injection import JuicefsClientKill, MetadataEngineLoss, parse_injection
from gpufleet.chaos.backends.storage import StorageBackend
from gpufleet.config.load import load_named_stack
from gpufleet.config.model import JuiceFsSpec, Secret
from gpufleet.core import juicefs as jfs
from gpufleet.core.checkpoint_manifest import parse_stem, stem
from gpufleet.core.errors import InputError
from gpufleet.core.fs_checkpoints import FsCheckpointStore
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.storage import monitoring
from gpufleet.sandbox.storage.doctor import juicefs_check
from gpufleet.sandbox.storage.juicefs import (
    checkpoint_folder,
    plan_juicefs,
    record_for,
    training_checkpoint_dir,
)
from gpufleet.sandbox.storage.metadata_backup import prune

STACKS = Path(__file__).parents[3] / "stacks"
STACK = "sandbox-storage-juicefs"


# --------------------------------------------------------------------------- the plan


def test_the_plan_follows_the_stacks_juicefs_section() -> None:
    spec = load_named_stack(STACK, STACKS)
    plan = plan_juicefs(STACK, spec)
    assert plan is not None
    assert (plan.name, plan.bucket, plan.db, plan.checkpoint_folder) == ("jfs", "jfs-data", 1, "checkpoints")
    assert plan.cache_mib == 512  # 1 GiB asked, the sandbox's cap
    rec = record_for(plan, Path("/r/run-1"), {"redis": 7001, "redis-scratch": 7002, "juicefs-metrics": 7003})
    assert rec.meta_url == "redis://127.0.0.1:7001/1"
    assert rec.mountpoint == "/r/run-1/juicefs/mnt"
    assert rec.checkpoint_dir == "/r/run-1/juicefs/mnt/checkpoints"
    assert rec.metrics == "127.0.0.1:7003"


def test_the_ceph_only_stack_has_no_juicefs_and_checkpoints_on_s3() -> None:
    spec = load_named_stack("sandbox-storage", STACKS)
    assert plan_juicefs("sandbox-storage", spec) is None
    assert checkpoint_folder(spec) is None


def _storage_state(phase: str = "up") -> StorageSandboxState:
    spec = load_named_stack(STACK, STACKS)
    plan = plan_juicefs(STACK, spec)
    assert plan is not None
    rec = record_for(plan, Path("/r/run-1"), {"redis": 7001, "redis-scratch": 7002, "juicefs-metrics": 7003})
    return StorageSandboxState.model_validate(
        {"stack": STACK, "run_id": "1", "phase": phase, "base_dir": "/r/run-1", "created_at": 0.0,
         "juicefs": rec.model_dump()}
    )


def test_the_training_job_checkpoints_in_a_folder_of_its_own_on_the_mounted_volume() -> None:
    spec = load_named_stack(STACK, STACKS)
    seen: list[Path] = []

    def is_mounted(p: Path) -> bool:
        seen.append(p)
        return True

    got = training_checkpoint_dir(STACK, spec, _storage_state(), is_mounted, "abc123")
    assert got == Path("/r/run-1/juicefs/mnt/checkpoints/job-abc123")
    assert seen == [Path("/r/run-1/juicefs/mnt")]
    # The writer's store tells the job's folder apart from its own checkpoints: not a checkpoint stem.
    assert parse_stem(got.name) is None
    # A stack that checkpoints on S3 keeps the job's checkpoints in the run folder.
    s3 = load_named_stack("sandbox-storage", STACKS)
    assert training_checkpoint_dir("sandbox-storage", s3, None, is_mounted, "abc123") is None


@pytest.mark.parametrize(
    ("storage", "mounted", "why"),
    [
        (None, True, "which is not up"),
        ("deleting", True, "which is not up"),
        ("up", False, "which is not mounted at /r/run-1/juicefs/mnt"),
    ],
)
def test_the_training_job_never_falls_back_to_a_local_folder(
    storage: str | None, mounted: bool, why: str
) -> None:
    spec = load_named_stack(STACK, STACKS)
    state = _storage_state(storage) if storage else None
    with pytest.raises(InputError) as e:
        training_checkpoint_dir(STACK, spec, state, lambda _p: mounted, "abc123")
    text = str(e.value)
    assert "storage.checkpoint.location" in text and why in text, text
    assert f"gpufleet sandbox up --storage --stack {STACK}" in text, text


def _with_juicefs(**fields: Any) -> Any:
    spec = load_named_stack(STACK, STACKS)
    js = spec.storage.juicefs
    assert js is not None
    return spec.model_copy(
        update={"storage": spec.storage.model_copy(update={"juicefs": js.model_copy(update=fields)})}
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"meta_url": Secret(plain="tikv://pd:2379/jfs")}, r"metaUrl: scheme 'tikv'"),
        ({"meta_url": Secret(plain="redis://127.0.0.1/x")}, r"metaUrl: database 'x' is not"),
        ({"meta_url": Secret(secure="v1:abc")}, r"metaUrl: the sandbox needs it in plain text"),
        ({"bucket": "s3://somewhere/jfs"}, r"bucket: 's3://somewhere/jfs': the sandbox needs a plain"),
        ({"bucket": "checkpoints"}, r"already the checkpoint or backup bucket"),
        ({"storage": "gs"}, r"storage: 'gs'"),
        ({"name": "other"}, r"location: 'juicefs://jfs/checkpoints' names volume 'jfs'"),
    ],
)
def test_what_the_sandbox_cannot_realise_is_refused_with_its_path(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        plan_juicefs("x", _with_juicefs(**fields))


def test_a_juicefs_location_without_a_juicefs_section_is_refused() -> None:
    spec = load_named_stack(STACK, STACKS)
    bare = spec.model_copy(update={"storage": spec.storage.model_copy(update={"juicefs": None})})
    with pytest.raises(InputError, match=r"the stack has no storage\.juicefs"):
        plan_juicefs("x", bare)


def test_the_juicefs_spec_keeps_the_metadata_url_a_secret() -> None:
    js = JuiceFsSpec.model_validate({"metaUrl": "redis://h/1", "bucket": "b"})
    assert "redis://h/1" not in repr(js)


# --------------------------------------------------------------------------- commands


def test_commands_keep_keys_off_the_format_and_mount_command_lines() -> None:
    fmt = jfs.format_argv("redis://127.0.0.1:1/1", "jfs", "http://127.0.0.1:2/jfs-data")
    assert (
        fmt[1:3] == ["format", "--storage"]
        and "--trash-days" in fmt
        and fmt[-2:] == ["redis://127.0.0.1:1/1", "jfs"]
    )
    mount = jfs.mount_argv("redis://127.0.0.1:1/1", Path("/m"), Path("/c"), 64, "127.0.0.1:3")
    assert "--no-usage-report" in mount and mount[mount.index("--backup-meta") + 1] == "0"
    assert mount[-2:] == ["redis://127.0.0.1:1/1", "/m"]
    assert not any("secret" in a.lower() for a in fmt + mount)
    assert jfs.redis_cli(5, "PING", db=2) == ["redis-cli", "-h", "127.0.0.1", "-p", "5", "-n", "2", "PING"]


def test_mounted_reads_the_mount_visible_last_in_mountinfo() -> None:
    info = ("36 25 0:32 / /r rw shared:12 - tmpfs tmpfs rw\n"
            "612 36 0:48 / /r/mnt rw,relatime shared:300 - fuse.juicefs JuiceFS:jfs rw,user_id=0\n"
            "613 36 0:49 / /r/other rw - tmpfs tmpfs rw\n")
    assert jfs.mounted(Path("/r/mnt"), info)
    assert not jfs.mounted(Path("/r/other"), info)
    assert not jfs.mounted(Path("/r"), info)
    # A tmpfs stacked over the volume hides it: what a process sees there is not JuiceFS.
    assert not jfs.mounted(Path("/r/mnt"), info + "700 612 0:50 / /r/mnt rw - tmpfs tmpfs rw\n")


def test_the_fuse_connection_is_read_from_mountinfo() -> None:
    info = (
        "36 25 0:32 / /run rw,nosuid shared:12 - tmpfs tmpfs rw\n"
        "612 36 0:48 / /r/juicefs/mnt rw,relatime shared:300 - fuse.juicefs JuiceFS:jfs rw,user_id=0\n"
    )
    assert jfs.fuse_connection(Path("/r/juicefs/mnt"), info) == 48  # /sys/fs/fuse/connections/48
    assert jfs.fuse_connection(Path("/r/other"), info) is None


# --------------------------------------------------------------------------- dumps


def _node(kind: str, entries: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"attr": {"type": kind}, **({"entries": entries} if entries is not None else {})}


def _dump(files: int, dirs: int = 1, trash_files: int = 0) -> dict[str, Any]:
    tree = {
        f"d{i}": _node("directory", {f"f{j}": _node("regular") for j in range(files)}) for i in range(dirs)
    }
    doc: dict[str, Any] = {
        "Setting": {"Name": "jfs"},
        "Counters": {"usedInodes": dirs + dirs * files + trash_files},
        "FSTree": _node("directory", tree),
    }
    if trash_files:
        doc["Trash"] = _node(
            "directory",
            {"2026-12-05-01": _node("directory", {f"t{k}": _node("regular") for k in range(trash_files)})},
        )
    return doc


def test_a_dump_is_counted_with_its_trash() -> None:
    c = jfs.count_dump(_dump(files=3, dirs=2, trash_files=2))
    assert (c.files, c.inodes, c.used_inodes) == (
        8,
        2 + 6 + 1 + 2,
        10,
    )  # the trash's hour folder is listed too
    with pytest.raises(ValueError, match="not a JuiceFS metadata dump"):
        jfs.count_dump({"hello": 1})


def test_a_dump_that_loads_back_the_same_and_matches_the_live_file_system_is_a_backup() -> None:
    c = jfs.count_dump(_dump(files=4))
    assert jfs.judge_dump(c, c, (5, 5), previous_inodes=5) == []
    assert jfs.judge_dump(c, c, (3, 7), previous_inodes=None) == []  # the live count moved during the dump


def test_what_makes_a_dump_a_failed_backup() -> None:
    c = jfs.count_dump(_dump(files=4))
    assert jfs.judge_dump(None, None, None, None) == ["the dump is not a readable JuiceFS dump"]
    (why,) = jfs.judge_dump(c, None, (5, 5), None, load_error="exit 1: parse name")
    assert why == "the dump did not load into a scratch engine: exit 1: parse name"
    fewer = jfs.count_dump(_dump(files=3))
    assert "holds 3 files / 4 inodes, the dump 4 / 5" in jfs.judge_dump(c, fewer, (5, 5), None)[0]
    assert "the live file system had 40 to 40" in jfs.judge_dump(c, c, (40, 40), None)[0]
    assert "shrank sharply: 5 inodes against 11" in jfs.judge_dump(c, c, (5, 5), previous_inodes=11)[0]
    assert jfs.judge_dump(c, c, (5, 5), previous_inodes=10) == []  # half is the floor, not below it


@settings(max_examples=50, deadline=None)
@given(inodes=st.integers(0, 10_000), previous=st.integers(1, 10_000))
def test_shrinking_below_half_of_the_previous_dump_always_fails(inodes: int, previous: int) -> None:
    c = jfs.DumpCounts(files=0, inodes=inodes, used_inodes=inodes)
    problems = jfs.judge_dump(c, c, None, previous)
    assert bool(problems) == (inodes < previous * jfs.SHRINK_FLOOR)


def _evidence(at: float, verified: bool) -> jfs.DumpEvidence:
    return jfs.DumpEvidence(dump=jfs.dump_key(at), taken_at=at, seconds=0.3, verified=verified)


def test_a_restore_takes_the_newest_verified_dump() -> None:
    history = [_evidence(10, True), _evidence(15, True), _evidence(20, False), _evidence(25, False)]
    chosen = jfs.newest_verified(history)
    assert chosen is not None and chosen.taken_at == 15
    assert jfs.newest_verified([_evidence(1, False)]) is None
    assert jfs.dump_key(9.5) < jfs.dump_key(10.25) < jfs.dump_key(100.0)  # keys sort by time
    assert jfs.evidence_key(jfs.dump_key(1)).endswith(".json.evidence.json")


class _Deletes:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_object(self, Bucket: str, Key: str) -> None:
        self.deleted.append(Key)


def test_pruning_keeps_the_newest_dumps_and_always_the_newest_verified() -> None:
    history = [_evidence(1, True), *[_evidence(t, False) for t in range(2, 6)]]
    client = _Deletes()
    prune(client, "b", history, keep=2)
    gone = {k for k in client.deleted if not k.endswith(jfs.EVIDENCE_SUFFIX)}
    assert gone == {jfs.dump_key(2), jfs.dump_key(3)}  # dump 1 is the only verified one: kept
    assert len(client.deleted) == 4  # each with its evidence


# --------------------------------------------------------------------------- checkpoints on a mount


def _put(store: FsCheckpointStore, step: int) -> None:
    store.put(
        (1, 0, step),
        {"shard-00.bin": os.urandom(2048), "shard-01.bin": os.urandom(100)},
        b'{"s":1}',
        1.0 * step,
    )


def test_checkpoints_on_a_file_system_verify_and_resume_from_the_newest(tmp_path: Path) -> None:
    store = FsCheckpointStore(tmp_path)
    for step in (10, 20, 30):
        _put(store, step)
    assert [m.step for m in store.complete()] == [10, 20, 30]
    choice = store.newest_verified()
    assert choice.chosen is not None and choice.chosen.key == (1, 0, 30) and choice.skipped == ()
    store.delete((1, 0, 10))
    assert [m.step for m in store.complete()] == [20, 30]
    assert not any(
        p.name.startswith(".") for p in (tmp_path / stem((1, 0, 30))).iterdir()
    )  # no temp files left


def test_a_flipped_bit_or_a_missing_manifest_is_skipped(tmp_path: Path) -> None:
    store = FsCheckpointStore(tmp_path)
    for step in (10, 20, 30):
        _put(store, step)
    shard = tmp_path / stem((1, 0, 30)) / "shard-00.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01  # same size, one bit
    shard.write_bytes(bytes(data))
    (tmp_path / stem((1, 0, 20)) / "MANIFEST.json").unlink()
    choice = store.newest_verified()
    assert choice.chosen is not None and choice.chosen.key == (1, 0, 10)
    reasons = dict(choice.skipped)
    assert reasons[(1, 0, 30)].startswith("corrupt: shard-00.bin: sha256")
    assert reasons[(1, 0, 20)].startswith("incomplete")


def test_a_save_killed_before_its_manifest_is_incomplete(tmp_path: Path) -> None:
    """A real SIGKILL between a checkpoint's files and its manifest (the writer stops itself there)."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import gpufleet.core.fs_checkpoints as f\n"
        "real = f.create_no_replace\n"
        "def stop(path, data):\n"
        "    if path.name == 'MANIFEST.json': os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(path, data)\n"
        "f.create_no_replace = stop\n"
        "f.FsCheckpointStore(Path(sys.argv[1])).put((1, 0, 5), {'shard-00.bin': b'x' * 10}, b'{}', 1.0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=60)
    assert res.returncode == -signal.SIGKILL
    store = FsCheckpointStore(tmp_path)
    assert (tmp_path / stem((1, 0, 5)) / "shard-00.bin").exists()
    (c,) = store.candidates()
    assert c.manifest is None and c.problem is not None and c.problem.startswith("incomplete")
    assert store.newest_verified().chosen is None


# --------------------------------------------------------------------------- faults, probe, doctor


def test_the_juicefs_faults_are_typed_injections_of_the_storage_backend() -> None:
    assert isinstance(parse_injection({"method": "metadata-engine-loss"}), MetadataEngineLoss)
    assert isinstance(parse_injection({"method": "juicefs-client-kill"}), JuicefsClientKill)
    assert {MetadataEngineLoss, JuicefsClientKill} <= StorageBackend.capabilities


def test_prometheus_probes_the_metadata_engine_with_redis_ping() -> None:
    plan = monitoring.MonitoringPlan(
        scrape_s=2, evaluation_s=1, rule_file=Path("/r.yml"), metadata_engine=True
    )
    ports = {"mgr-prometheus": 1, "blackbox": 2, "prometheus": 3}
    cfg = monitoring.prometheus_config(
        plan, ports, "http://127.0.0.1:9", "r1", "127.0.0.1:7001", "127.0.0.1:7003"
    )
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    # The mount's own metrics, whose scrape failing is StorageJuicefsClientDown.
    assert jobs[monitoring.JUICEFS_CLIENT_JOB]["static_configs"] == [{"targets": ["127.0.0.1:7003"]}]
    engine = jobs[monitoring.METADATA_ENGINE_JOB]
    assert engine["params"] == {"module": [monitoring.REDIS_MODULE]}
    assert engine["static_configs"] == [{"targets": ["127.0.0.1:7001"]}]
    module = monitoring.blackbox_config(2)["modules"][monitoring.REDIS_MODULE]
    assert module["tcp"]["query_response"] == [{"send": "PING"}, {"expect": "^\\+PONG"}]
    without = monitoring.prometheus_config(plan, ports, "http://127.0.0.1:9", "r1")
    assert {j["job_name"] for j in without["scrape_configs"]} == {
        monitoring.CEPH_JOB,
        monitoring.OBJECT_STORE_JOB,
    }


def test_the_doctor_wants_the_pinned_juicefs() -> None:
    assert juicefs_check("juicefs version 1.4.2+2026-10-26.pypi\n").ok
    wrong = juicefs_check("juicefs version 1.3.0+2025-01-01\n")
    assert not wrong.ok and "make venv" in wrong.fix
    assert not juicefs_check("").ok


def test_drill_list_shows_the_metadata_drill_and_its_activities_exist() -> None:
    import importlib
    import json

    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    drills = Path(__file__).parents[3] / "experiments" / "drills"
    r = CliRunner().invoke(app, ["drill", "list", "--drills-dir", str(drills)])
    assert r.exit_code == 0 and "metadata-engine-lost" in r.output, r.output
    doc = json.loads((drills / "metadata-engine-lost.json").read_text())
    assert doc["configuration"]["gpufleet_stack"] == STACK
    activities = [*doc["steady-state-hypothesis"]["probes"], *doc["method"], *doc["rollbacks"]]
    for a in activities:
        provider = a["provider"]
        assert callable(getattr(importlib.import_module(provider["module"]), provider["func"])), provider
    assert [a["provider"]["func"] for a in doc["method"]] == ["metadata_engine_loss", "restore_storage"]
