"""End to end on a real Ceph cluster (Debian's Ceph 16) brought up by `gpufleet sandbox up --storage`:
health, S3 through boto3 (multipart, versioned backup bucket), the checkpoint-bucket-lost drill with
an RPO/RTO verdict, an OSD killed under the checkpoint writer's load with its rollback, and a
`down` that leaves nothing. One cluster for the module (bring-up ~15-30 s on 2 cores).

First, on a cluster of its own (stack sandbox-storage-juicefs, up and down before the module's):
JuiceFS with a real Redis metadata engine on radosgw, the checkpoint writer on the mount, metadata
dumps proven restorable in a scratch Redis, the client killed ("Transport endpoint is not
connected") and remounted, the metadata engine lost with its alert and restore, drill
metadata-engine-lost through `gpufleet drill run`, and last the Slurm sandbox's PyTorch training job
checkpointing on the volume through a killed client and the same drill (ADR 0068)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import gpufleet, sandbox_up, wait_until

from gpufleet.chaos import engine
from gpufleet.chaos.ledger import Ledger
from gpufleet.chaos.storage import actions, probes
from gpufleet.core import juicefs as jfs
from gpufleet.core import mounts
from gpufleet.core.ceph_admin import ceph_json
from gpufleet.core.job_checkpoints import JobCheckpoints
from gpufleet.core.jsonl import read_objects
from gpufleet.core.juicefs_backups import list_evidence
from gpufleet.core.procs import alive
from gpufleet.core.promapi import PrometheusClient
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.core.sandbox_contract import read_state
from gpufleet.core.storage_contract import StorageSandboxState, read_storage_state, storage_state_path

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the storage sandbox runs Ceph daemons as root"),
    pytest.mark.skipif(shutil.which("ceph-osd") is None, reason="Ceph is not installed (make apt)"),
]
STACK = "sandbox-storage"
JUICEFS_STACK = "sandbox-storage-juicefs"


def _up_and_down(root: Path, stack: str) -> Iterator[Path]:
    up = gpufleet(root, "sandbox", "up", "--storage", "--stack", stack, timeout=400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield root
    finally:
        state = read_storage_state(stack, root) if storage_state_path(stack, root).exists() else None
        down = gpufleet(root, "sandbox", "down", "--storage", "--stack", stack, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        # Nothing left: no daemon, no mount, no state file, no run directory (OSD block files included).
        if state is not None:
            assert not [p.name for p in state.processes if alive(p.pid, p.start_time)]
            if state.juicefs is not None:
                assert not jfs.mounted(Path(state.juicefs.mountpoint))
            assert not Path(state.base_dir).exists()
        assert not storage_state_path(stack, root).exists()
        again = gpufleet(root, "sandbox", "down", "--storage", "--stack", stack, timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr  # idempotent


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="Redis is not installed (make apt)")
@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="JuiceFS mounts through FUSE: no /dev/fuse")
class TestJuiceFs:
    @pytest.fixture(scope="class")
    def jroot(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        # A short folder: the last test's Slurm sandbox makes sockets under it (layout.SUN_PATH_MAX).
        yield from _up_and_down(tmp_path_factory.mktemp("jfs"), JUICEFS_STACK)

    @pytest.fixture
    def jstate(self, jroot: Path) -> StorageSandboxState:
        return read_storage_state(JUICEFS_STACK, jroot)

    @pytest.fixture
    def jconfig(
        self, jroot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[dict[str, str]]:
        monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(jroot))
        cfg = {
            "gpufleet_backend": "storage",
            "gpufleet_stack": JUICEFS_STACK,
            "gpufleet_ledger": str(tmp_path / "faults.jsonl"),
        }
        engine.end_runs()
        yield cfg
        engine.revert(cfg)
        engine.end_runs()

    def test_the_writer_checkpoints_on_the_mount_and_dumps_are_proven(
        self, jstate: StorageSandboxState, jconfig: dict[str, str]
    ) -> None:
        rec = jstate.juicefs
        assert rec is not None and rec.checkpoint_dir is not None
        assert jfs.mounted(Path(rec.mountpoint))
        intact = probes.checkpoints_intact("checkpoint", configuration=jconfig)
        assert intact["bucket"] == rec.checkpoint_dir and intact["status"] == "intact", intact
        assert intact["verified"] >= 1, intact
        # The data is in radosgw: the volume's bucket holds JuiceFS's chunks.
        client = store_for(jstate, rec.bucket).client
        assert client.list_objects_v2(Bucket=rec.bucket, Prefix=f"{rec.name}/chunks/").get("KeyCount", 0) > 0
        assert jstate.backup_bucket is not None
        wait_until(
            "two verified metadata dumps",
            lambda: len([e for e in list_evidence(client, jstate.backup_bucket or "") if e.verified]) >= 2,
            60,
            1,
        )
        evidence = list_evidence(client, jstate.backup_bucket)
        good = [e for e in evidence if e.verified]
        last = good[-1]
        # Loaded into the scratch Redis, the dump held the same files and inodes; the live file
        # system agreed; the previous verified dump was compared with.
        assert (last.reloaded_files, last.reloaded_inodes) == (last.files, last.inodes), last
        assert last.files is not None and last.files >= 4 and last.previous is not None, last
        assert not [e for e in evidence if not e.verified], [e.problems for e in evidence if not e.verified]
        # A damaged dump does not load into an engine (the check a failed backup is caught by).
        work = Path(jstate.base_dir) / "e2e"
        work.mkdir()
        client.download_file(jstate.backup_bucket, last.dump, str(work / "dump.json"))
        raw = (work / "dump.json").read_bytes()
        (work / "torn.json").write_bytes(raw[: len(raw) // 2])
        with pytest.raises(jfs.JuiceFsError, match="load failed"):
            jfs.run(jfs.load_argv(jfs.redis_url(rec.scratch_port, 9), work / "torn.json"))

    def test_a_killed_client_is_transport_endpoint_not_connected_until_remounted(
        self, jstate: StorageSandboxState, jconfig: dict[str, str]
    ) -> None:
        rec = jstate.juicefs
        assert rec is not None and rec.checkpoint_dir is not None
        assert jstate.prometheus_url is not None
        prom = PrometheusClient(jstate.prometheus_url, timeout=5)
        wait_until(
            "the mount's metrics scraped",
            lambda: prom.query('up{job="gpufleet-juicefs-client"}')[0]["value"][1] == "1",
            30,
        )
        t_kill = time.monotonic()
        out = actions.juicefs_client_kill(configuration=jconfig)
        assert out["kind"] == "juicefs-client-kill" and out["fault_id"] == "storage-juicefs-client-down", out
        wait_until(
            "StorageJuicefsClientDown",
            lambda: _alert(prom, "StorageJuicefsClientDown", instance=rec.metrics),
            60,
        )
        print(f"StorageJuicefsClientDown pending {time.monotonic() - t_kill:.1f} s after the client's kill")

        def errno_now() -> int:
            try:
                os.listdir(rec.checkpoint_dir or "")
            except OSError as e:
                return e.errno or 0
            return 0

        # The first call may see the connection aborted (ECONNABORTED) while the kernel notices the
        # dead client; from then on every call is ENOTCONN until the mount is replaced.
        wait_until("Transport endpoint is not connected", lambda: errno_now() == errno.ENOTCONN, 10, 0.2)
        t0 = time.time()
        actions.restore_storage(configuration=jconfig)
        assert os.listdir(rec.checkpoint_dir)
        wait_until("its alert gone", lambda: _alert(prom, "StorageJuicefsClientDown") is None, 60, 2)
        prom.close()
        wait_until("the writer saving on the new mount", lambda: _saved_since(jstate, t0), 60)
        intact = probes.checkpoints_intact("checkpoint", configuration=jconfig)
        assert intact["status"] == "intact" and intact["verified"] >= 1, intact

    def test_a_lost_metadata_engine_alerts_and_is_restored_from_the_newest_verified_dump(
        self, jstate: StorageSandboxState, jconfig: dict[str, str]
    ) -> None:
        rec = jstate.juicefs
        assert rec is not None and jstate.prometheus_url is not None and jstate.backup_bucket is not None
        # On its own (not after the tests above) the sandbox may be too young for a dump that holds a
        # checkpoint: wait for a verified checkpoint, then for a verified dump taken after it.
        wait_until("a checkpoint verified on the mount",
                   lambda: probes.checkpoints_intact("checkpoint", configuration=jconfig)["verified"] >= 1,
                   180, 2)
        t_saved, client = time.time(), store_for(jstate, rec.bucket).client
        wait_until("a verified metadata dump taken after it",
                   lambda: any(e.verified and e.taken_at > t_saved
                               for e in list_evidence(client, jstate.backup_bucket or "")), 120, 1)
        with PrometheusClient(jstate.prometheus_url, timeout=5) as prom:
            wait_until(
                "the metadata engine probed up",
                lambda: prom.query('probe_success{job="gpufleet-metadata-engine"}')[0]["value"][1] == "1",
                30,
            )
            # No dump after this point (the metadata backup job frozen until the restore is done), and
            # a file written now: what the restored engine will not know, and gc must find.
            backups = jstate.process("metadata-backup")
            os.kill(backups.pid, signal.SIGSTOP)
            with open(Path(rec.mountpoint) / "e2e-after-the-dump.bin", "wb") as f:
                f.write(os.urandom(6 << 20))
                f.flush()
                os.fsync(f.fileno())  # on JuiceFS: its blocks uploaded and the file committed
            # The gc after the restore leaves alone objects modified within the restore's own
            # duration + 1 s before it (the live client's uploads); a loss seconds after the write
            # put its blocks in that window (seen in CI: 0 leaks found, 6 skipped as newer). The loss
            # comes 5 s after the write, so its blocks are older than the window.
            time.sleep(5)
            t0 = time.monotonic()
            out = actions.metadata_engine_loss(configuration=jconfig)
            assert out["fault_id"] == "storage-metadata-loss" and out["kind"] == "metadata-engine-loss", out
            assert not any(Path(rec.meta_dir).iterdir())  # its data wiped
            engine_at = f"127.0.0.1:{rec.meta_port}"
            wait_until(
                "StorageMetadataEngineDown",
                lambda: _alert(prom, "StorageMetadataEngineDown", instance=engine_at),
                60,
            )
            print(f"StorageMetadataEngineDown pending {time.monotonic() - t0:.1f} s after Redis was lost")
            t1 = time.time()
            try:
                actions.restore_storage(configuration=jconfig)
            finally:
                os.kill(backups.pid, signal.SIGCONT)
            wait_until("its alert gone", lambda: _alert(prom, "StorageMetadataEngineDown") is None, 60, 2)
        (restore,) = [e for e in read_objects(jstate.events_file("metadata-restore")) if e["t"] >= t1]
        assert restore["loaded"] is not None and restore["verified"] and not restore["corrupt"], restore
        # The restored engine's slice ids start past every block in the bucket (the lost engine's
        # after the dump included): no new block takes a leak's key, so gc's passes agree below.
        counter = restore["loaded"]["slice_counter"]
        print(f"slice counter after the restore: {counter}")
        highest = counter["highest_in_bucket"]
        assert highest is not None and counter["loaded"] <= highest, counter  # ids the dump did not know
        assert counter["set_to"] > counter["highest_in_bucket"] + jfs.SLICE_ID_BATCH, counter
        # The file written after the newest dump is gone with the engine; its two blocks (4 + 2 MiB)
        # stayed in the bucket as leaks until `juicefs gc --delete` removed them.
        gc = restore["gc"]
        print(f"juicefs gc after the restore: {gc}")
        assert gc.get("error") is None, gc
        assert gc["leaked_found"] >= 2 and gc["deleted"] >= gc["leaked_found"] and gc["leaked_after"] == 0, gc
        assert not (Path(rec.mountpoint) / "e2e-after-the-dump.bin").exists()
        print(f"restored from {restore['loaded']}: checkpoints verified "
              f"{[c['checkpoint'] for c in restore['verified']]}")
        wait_until("the writer saving on the restored mount", lambda: _saved_since(jstate, t1), 60)
        # Checkpoints written after the restore read back as written (the restored engine reuses slice
        # ids: the client's cache of the lost ones must not answer for them; storage_undo._empty).
        t2 = time.time()
        wait_until("two more saves", lambda: _saved_since(jstate, t2, 2), 60)
        intact = probes.checkpoints_intact("checkpoint", configuration=jconfig)
        assert intact["status"] == "intact", intact

    def test_drill_metadata_engine_lost_meets_its_targets(
        self, jroot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("GPUFLEET_LEDGER", str(tmp_path / "faults.jsonl"))
        listed = gpufleet(jroot, "drill", "list", timeout=60)
        assert "metadata-engine-lost" in listed.stdout, listed.stdout + listed.stderr
        journal = tmp_path / "drill.json"
        argv = ["drill", "run", "metadata-engine-lost", "--stack", JUICEFS_STACK, "--journal", str(journal)]
        run = gpufleet(jroot, *argv, timeout=300)
        state = read_storage_state(JUICEFS_STACK, jroot)
        writer = read_objects(state.events_file("checkpoint-writer"))[-40:]
        out = run.stdout + run.stderr + "\nthe writer's last events:\n" + "\n".join(map(str, writer))
        assert run.returncode == 0, out
        from gpufleet.cli.drill_cmds import verdict_from_journal

        verdict = verdict_from_journal(json.loads(journal.read_text()))
        assert verdict is not None and verdict.outcome.value == "PASS", out
        assert verdict.rpo_seconds is not None and verdict.rto_seconds is not None
        assert {c.name: c.outcome.value for c in verdict.checks}["integrity"] == "PASS"
        assert verdict.resumed_after_seconds is not None  # the writer saved again on the restored mount
        print(f"metadata-engine-lost: RPO {verdict.rpo_seconds} s, RTO {verdict.rto_seconds} s, "
              f"writer on after {verdict.resumed_after_seconds} s, {verdict.steps_lost} steps lost")
        # The restore's juicefs gc: what it found it deleted, nothing left; and when the writer saved a
        # checkpoint between the restored dump and the failure, that checkpoint's blocks were leaks.
        ledger = Ledger(tmp_path / "faults.jsonl")
        (fault,) = [r for r in ledger.records() if r.kind == "metadata-engine-loss"]
        (restore,) = [e for e in read_objects(state.events_file("metadata-restore")) if e["t"] >= fault.at]
        gc = restore["gc"]
        print(f"metadata-engine-lost: juicefs gc {gc}")
        assert gc.get("error") is None and gc["deleted"] >= gc["leaked_found"] and gc["leaked_after"] == 0, gc
        taken_at = float(restore["loaded"]["taken_at"])
        events = read_objects(state.events_file("checkpoint-writer"))
        saves = [e for e in events if e.get("event") == "checkpoint"]
        if [e for e in saves if taken_at + 1.0 < float(e["t"]) < fault.at]:
            assert gc["leaked_found"] >= 1, gc
        assert "metadata-engine-lost: PASS" in out


    def test_the_training_job_checkpoints_on_the_volume_through_a_client_kill_and_the_drill(
        self, jroot: Path, jstate: StorageSandboxState, jconfig: dict[str, str], tmp_path: Path
    ) -> None:
        """The Slurm sandbox of the same stack, brought up after the storage sandbox, runs the
        PyTorch training job with its checkpoints in a folder of the JuiceFS volume (ADR 0068): seen
        from a rank's own mount namespace, through a killed client mounted again, and judged by
        drill metadata-engine-lost. Its `down` also takes the storage sandbox down."""
        rec = jstate.juicefs
        assert rec is not None and rec.checkpoint_dir is not None
        with sandbox_up(jroot, JUICEFS_STACK):
            sandbox = read_state(JUICEFS_STACK, jroot)
            assert sandbox.checkpoint_dir is not None and sandbox.training_events is not None
            folder = Path(sandbox.checkpoint_dir)
            assert folder == Path(rec.checkpoint_dir) / f"job-{sandbox.run_id}"
            events = Path(sandbox.training_events)
            first = wait_until("a checkpoint of the job that verifies on the volume",
                               lambda: JobCheckpoints(folder).newest_valid()[0], 90, 1)
            rank = _training_rank(folder)
            # The rank's own mount namespace (ip netns exec) holds the volume, from the shared folder.
            seen = mounts.mounts_at(rec.mountpoint, mounts.read_mountinfo(rank))
            assert seen and seen[-1].fs_type == "fuse.juicefs", seen

            t_kill = time.time()
            actions.juicefs_client_kill(configuration=jconfig)
            wait_until("the job's save failing on the dead client", lambda: [
                e for e in read_objects(events)
                if e.get("event") == "checkpoint_failed" and e["t"] > t_kill and e.get("errno") == "ENOTCONN"
            ], 30)
            t_back = time.time()
            actions.restore_storage(configuration=jconfig)
            saved = wait_until("the job saving on the new mount", lambda: [
                e for e in read_objects(events) if e.get("event") == "checkpoint" and e["t"] > t_back
            ], 60)
            # The new mount reached the rank's namespace (the dead one gave ENOTCONN to every call):
            # one JuiceFS mount there, and the save made through it verifies.
            seen = mounts.mounts_at(rec.mountpoint, mounts.read_mountinfo(rank))
            assert [m.fs_type for m in seen] == ["fuse.juicefs"], seen
            newest, _ = JobCheckpoints(folder).newest_valid()
            assert newest is not None and newest.key.step >= int(saved[0]["step"]) > first.key.step
            assert _training_rank(folder) == rank, "the job's rank did not live through the client's kill"
            print(f"training job: saves failed with ENOTCONN after the kill, saved again "
                  f"{saved[0]['t'] - t_back:.1f} s after the remount (step {saved[0]['step']})")

            # The drill restores the newest verified dump: wait for one that holds the job's saves
            # (a dump taken before the job's first save would rightly fail the drill: no checkpoint
            # of the job could come back).
            t_saved = float(saved[0]["t"])
            client = store_for(jstate, rec.bucket).client
            wait_until("a verified metadata dump taken after the job's save",
                       lambda: any(e.verified and e.taken_at > t_saved
                                   for e in list_evidence(client, jstate.backup_bucket or "")), 60, 1)
            journal = tmp_path / "drill.json"
            run = gpufleet(jroot, "drill", "run", "metadata-engine-lost", "--stack", JUICEFS_STACK,
                           "--journal", str(journal), timeout=300)
            out = run.stdout + run.stderr
            assert run.returncode == 0, out
            from gpufleet.cli.drill_cmds import verdict_from_journal

            verdict = verdict_from_journal(json.loads(journal.read_text()))
            assert verdict is not None and verdict.outcome.value == "PASS", out
            integrity = {c.name: c for c in verdict.checks}["integrity"]
            assert f"of the training job ({folder.name})" in integrity.detail, integrity
            assert verdict.rto_seconds is not None and verdict.resumed_after_seconds == verdict.rto_seconds
            assert JobCheckpoints(folder).newest_valid()[0] is not None
            print(f"metadata-engine-lost on the training job: RPO {verdict.rpo_seconds} s, RTO "
                  f"{verdict.rto_seconds} s (its first step after the restore), {verdict.steps_lost} "
                  f"steps lost; {integrity.detail}")
        # `down` without --storage took the storage sandbox with it: no mount, no shared folder left.
        assert not storage_state_path(JUICEFS_STACK, jroot).exists()
        info = mounts.read_mountinfo()
        assert not [m for m in mounts.parse_mountinfo(info) if m.mount_point.startswith(jstate.base_dir)]


def _training_rank(folder: Path) -> int:
    """The pid of a training rank that checkpoints in `folder`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpufleet.sandbox.training.train" in argv and str(folder).encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no training rank checkpoints in {folder}")


def _saved_since(state: StorageSandboxState, t0: float, count: int = 1) -> bool:
    events = read_objects(state.events_file("checkpoint-writer"))
    return len([e for e in events if e.get("event") == "checkpoint" and float(e["t"]) > t0]) >= count


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from _up_and_down(tmp_path_factory.mktemp("storage-root"), STACK)


@pytest.fixture
def state(root: Path) -> StorageSandboxState:
    return read_storage_state(STACK, root)


@pytest.fixture
def config(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(root))
    cfg = {
        "gpufleet_backend": "storage",
        "gpufleet_stack": STACK,
        "gpufleet_ledger": str(tmp_path / "faults.jsonl"),
    }
    engine.end_runs()
    yield cfg
    engine.revert(cfg)
    engine.end_runs()


def test_the_cluster_is_healthy_and_speaks_s3(state: StorageSandboxState, config: dict[str, str]) -> None:
    assert len(state.osds) == 3 and (state.pool_size, state.pool_min_size) == (2, 1)
    health = probes.ceph_health(configuration=config)
    assert health["status"] == "HEALTH_OK", health
    assert probes.object_store_available(configuration=config)["status"] == "available"
    assert state.backup_bucket is not None
    client = store_for(state, state.backup_bucket).client
    assert client.get_bucket_versioning(Bucket=state.backup_bucket)["Status"] == "Enabled"
    # A 40 MiB checkpoint goes up in multipart pieces and reads back bit for bit.
    store = store_for(state, state.backup_bucket, "e2e/")
    big = {"model.bin": os.urandom(40 * 1024 * 1024), "optim.bin": os.urandom(1024)}
    m = store.put((42, 0, 7), big, b'{"step": 7}', 0.0)
    assert store.verify(m) == []
    store.delete((42, 0, 7))


@pytest.mark.parametrize("drill", ["checkpoint-bucket-lost", "osd-lost"])
def test_drill_meets_its_targets(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drill: str
) -> None:
    monkeypatch.setenv("GPUFLEET_LEDGER", str(tmp_path / "faults.jsonl"))  # this test's own ledger
    journal = tmp_path / "drill.json"
    run = gpufleet(root, "drill", "run", drill, "--stack", STACK, "--journal", str(journal), timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    from gpufleet.cli.drill_cmds import verdict_from_journal

    verdict = verdict_from_journal(json.loads(journal.read_text()))
    assert verdict is not None and verdict.outcome.value == "PASS", out
    assert verdict.rpo_seconds is not None and verdict.rto_seconds is not None
    assert {c.name: c.outcome.value for c in verdict.checks}["integrity"] == "PASS"
    if drill == "checkpoint-bucket-lost":
        assert verdict.resumed_after_seconds is not None  # the writer resumed from the restored checkpoint
    assert f"{drill}: PASS" in out


def test_osd_killed_under_load_is_restarted_and_nothing_is_lost(
    state: StorageSandboxState, config: dict[str, str]
) -> None:
    t0 = time.time()
    out = actions.osd_kill(1, configuration=config)
    assert out["kind"] == "osd-kill"
    wait_until("osd.1 marked down", lambda: ceph_json(state, "osd", "stat")["num_up_osds"] == 2, 60)
    # The guard: a second OSD down would leave some placement group with no copy up.
    from chaoslib.exceptions import InvalidActivity

    with pytest.raises(InvalidActivity, match="blast-radius guard refused"):
        actions.osd_kill(2, configuration=config)
    # Writes go on with one copy (min_size 1) while the OSD is down.
    assert probes.object_store_available(configuration=config)["status"] == "available"
    actions.restore_storage(configuration=config)
    wait_until(
        "every PG active+clean again", lambda: probes.ceph_health(configuration=config)["clean"], 120, 2
    )
    intact = probes.checkpoints_intact("checkpoint", configuration=config)
    assert intact["status"] == "intact" and intact["verified"] >= 1, intact
    backups = probes.checkpoints_intact("backup", configuration=config)
    assert backups["status"] == "intact" and backups["verified"] >= 1, backups
    # The writer's S3 traffic during the fault: every save since it succeeded (none failed, so no
    # S3 error is unaccounted for), and it kept saving.
    events = [json.loads(x) for x in state.events_file("checkpoint-writer").read_text().splitlines() if x]
    since = [e for e in events if e["t"] >= t0]
    assert [e for e in since if e["event"] != "checkpoint"] == []
    assert len([e for e in since if e["event"] == "checkpoint"]) >= 3
    # And none of those saves lost: each is still listed unless the writer's retention pruned it.
    from gpufleet.chaos.storage.thrash import lost_saves
    from gpufleet.core.fs_checkpoints import checkpoint_store_of

    have = {(m.restart, m.step) for m in checkpoint_store_of(state).complete()}
    assert lost_saves(events, have, t0)[1] == []


def test_osd_thrash_under_load_reads_back_everything_it_wrote(
    state: StorageSandboxState, config: dict[str, str]
) -> None:
    """Issue 14's thrasher, short: 2 minutes (at most 12 changes, seeded) of OSDs marked out, killed,
    marked down, marked in and revived within max dead 1 / min in 2 (size 2, min_size 1, 3 OSDs),
    under the checkpoint writer's load, with the S3 oracle checking every read by sha256."""
    report = actions.osd_thrash(
        minutes=2, max_changes=12, seed=20261205, min_pause_seconds=1, max_pause_seconds=3,
        configuration=config,
    )
    print("thrash report:", json.dumps({k: v for k, v in report.items() if k != "timeline"}, default=str))
    for row in report["timeline"]:
        print("thrash change:", json.dumps(row))
    assert report["outcome"] == "PASS", report["problems"]
    assert report["limits"]["max_dead"] == 1 and report["limits"]["min_in"] == 2
    oracle = report["oracle"]
    assert oracle["writes"] > 0 and oracle["reads"] > oracle["writes"], oracle
    assert oracle["mismatches"] == [] and oracle["unrecovered"] == [] and oracle["unaccounted"] == [], oracle
    assert report["writer_failures"]["unaccounted"] == [], report["writer_failures"]
    ckpt = report["checkpoints"]
    assert ckpt["corrupt"] == [] and ckpt["lost"] == [] and ckpt["saved_during"] >= 3, ckpt
    assert report["time_to_clean_s"]["n"] >= 1 and report["time_to_clean_s"]["max"] is not None, report
    assert report["thrash_changes"] >= 2, report
    # Every change went to the ledger (before it was applied) and none is left to undo.
    ledger = engine.context(config).ledger
    entries = [r for r in ledger.records() if r.kind == "osd-thrash"]
    assert len(entries) == report["changes"]
    assert [r for r in ledger.pending() if r.kind == "osd-thrash"] == []
    osds = ceph_json(state, "osd", "dump")["osds"]
    assert all(o["up"] and o["in"] for o in osds), osds
    assert probes.thrash_within_limits(configuration=config)["outcome"] == "PASS"


def _alert(prom: PrometheusClient, alertname: str, /, **labels: str) -> dict[str, Any] | None:
    for a in prom.alerts():
        if a["labels"].get("alertname") == alertname and all(
            a["labels"].get(k) == v for k, v in labels.items()
        ):
            return a
    return None


def test_catalog_alerts_on_the_real_ceph_exporter_and_radosgw_probe(
    state: StorageSandboxState, config: dict[str, str]
) -> None:
    """Each Ceph fault of the catalog, injected through its action, turns its generated alert on in
    the storage sandbox's Prometheus (ceph-mgr's prometheus module, a blackbox probe of radosgw, the
    rule file `gpufleet generate` writes); each ends when the fault is undone. Alerts with a hold of
    minutes are seen pending (the expression matched the real series), OSD full firing (30 s)."""
    assert state.prometheus_url is not None
    with PrometheusClient(state.prometheus_url, timeout=5) as prom:
        jobs = {t["labels"]["job"]: t["health"] for t in prom.targets()}
        assert jobs == {"ceph": "up", "gpufleet-object-store": "up"}, jobs
        assert prom.query('ceph_osd_up{ceph_daemon="osd.0"}')[0]["value"][1] == "1"
        assert prom.query('probe_success{job="gpufleet-object-store"}')[0]["value"][1] == "1"
        assert not [a for a in prom.alerts() if a["labels"]["alertname"].startswith("StorageCeph")]

        t0 = time.monotonic()
        out = actions.osd_kill(0, configuration=config)
        assert out["fault_id"] == "storage-ceph-osd-down", out
        wait_until(
            "StorageCephOsdDown for osd.0",
            lambda: _alert(prom, "StorageCephOsdDown", ceph_daemon="osd.0"),
            90,
        )
        print(f"StorageCephOsdDown pending {time.monotonic() - t0:.1f} s after the kill")
        actions.restore_storage(configuration=config)
        wait_until("osd.0 up, its alert gone", lambda: _alert(prom, "StorageCephOsdDown") is None, 90, 2)

        t0 = time.monotonic()
        actions.object_store_outage(configuration=config)
        endpoint = state.s3_endpoint or ""
        wait_until(
            "StorageObjectStoreDown", lambda: _alert(prom, "StorageObjectStoreDown", instance=endpoint), 60
        )
        print(f"StorageObjectStoreDown pending {time.monotonic() - t0:.1f} s after radosgw was killed")
        actions.restore_storage(configuration=config)
        wait_until("radosgw probed again", lambda: _alert(prom, "StorageObjectStoreDown") is None, 60, 2)

        actions.osd_near_full(configuration=config)
        wait_until(
            "StorageCephOsdNearFull", lambda: _alert(prom, "StorageCephOsdNearFull", name="OSD_NEARFULL"), 90
        )
        actions.restore_storage(configuration=config)
        wait_until("near-full cleared", lambda: _alert(prom, "StorageCephOsdNearFull") is None, 90, 2)

        t0 = time.monotonic()
        actions.osd_near_full(full=True, configuration=config)

        def full_firing() -> bool:
            a = _alert(prom, "StorageCephOsdFull", name="OSD_FULL")
            return a is not None and a["state"] == "firing"

        wait_until("StorageCephOsdFull firing", full_firing, 120, 2)
        print(f"StorageCephOsdFull firing {time.monotonic() - t0:.1f} s after the full ratio was lowered")
        actions.restore_storage(configuration=config)
        wait_until("full cleared", lambda: _alert(prom, "StorageCephOsdFull") is None, 90, 2)
    wait_until(
        "HEALTH_OK again", lambda: probes.ceph_health(configuration=config)["status"] == "HEALTH_OK", 120, 2
    )
