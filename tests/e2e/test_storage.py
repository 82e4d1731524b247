"""End to end on a real Ceph cluster (Debian's Ceph 16) brought up by `gpufleet sandbox up --storage`:
health, S3 through boto3 (multipart, versioned backup bucket), the checkpoint-bucket-lost drill with
an RPO/RTO verdict, an OSD killed under the checkpoint writer's load with its rollback, and a
`down` that leaves nothing. One cluster for the module (bring-up ~15-30 s on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import gpufleet, wait_until

from gpufleet.chaos import engine
from gpufleet.chaos.storage import actions, probes
from gpufleet.core.ceph_admin import ceph_json
from gpufleet.core.procs import alive
from gpufleet.core.promapi import PrometheusClient
from gpufleet.core.s3_checkpoints import store_for
from gpufleet.core.storage_contract import StorageSandboxState, read_storage_state, storage_state_path

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the storage sandbox runs Ceph daemons as root"),
    pytest.mark.skipif(shutil.which("ceph-osd") is None, reason="Ceph is not installed (make apt)"),
]
STACK = "sandbox-storage"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("storage-root")
    up = gpufleet(root, "sandbox", "up", "--storage", "--stack", STACK, timeout=400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield root
    finally:
        state = read_storage_state(STACK, root) if storage_state_path(STACK, root).exists() else None
        down = gpufleet(root, "sandbox", "down", "--storage", "--stack", STACK, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        # Nothing left: no daemon, no state file, no run directory (OSD block files included).
        if state is not None:
            assert not [p.name for p in state.processes if alive(p.pid, p.start_time)]
            assert not Path(state.base_dir).exists()
        assert not storage_state_path(STACK, root).exists()


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
