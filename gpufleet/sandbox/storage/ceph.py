"""`gpufleet sandbox up|status|down --storage`: a real Ceph cluster for a stack, from Debian's packages.

Bring-up, after Ceph's manual deployment procedure (no cephadm, no containers):
  keys + ceph.conf + monmap ─► ceph-mon --mkfs ─► ceph-mon ─┬► ceph-mgr
                                                            └► per OSD, in parallel: `ceph osd new`,
                                                               ceph-osd --mkfs (BlueStore on a sparse
                                                               file), ceph-osd
  all OSDs up ─► the mgr's prometheus module ─► radosgw ─► S3 user (radosgw-admin) ─► buckets (backup
  bucket versioned) ─► HEALTH_OK ─► blackbox exporter + Prometheus with the catalog's rules (monitoring.py)
Every daemon is started from a recorded Launch recipe (gpufleet.core.sandbox_contract), in the
foreground (`-f`) so its PID is the daemon's, and recorded in the state file the moment it starts;
`down` stops them from the state file alone (any phase, idempotent) and removes the run directory,
OSD block files included.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from gpufleet.config.model import StackSpec, duration_seconds
from gpufleet.core import ceph_admin, mounts, procs, s3
from gpufleet.core import juicefs as jfs
from gpufleet.core.promapi import PrometheusClient
from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.core.storage_contract import (
    OsdRecord,
    S3Credentials,
    StorageSandboxState,
    read_storage_state,
    storage_state_path,
    write_storage_state,
)
from gpufleet.sandbox import processes, run_teardown
from gpufleet.sandbox.kube.daemons import free_ports
from gpufleet.sandbox.layout import new_run_id
from gpufleet.sandbox.processes import Timings
from gpufleet.sandbox.prometheus import repo_rule_file
from gpufleet.sandbox.readiness import wait_for
from gpufleet.sandbox.run_teardown import RunDownReport
from gpufleet.sandbox.storage import juicefs, monitoring
from gpufleet.sandbox.storage.ceph_config import (
    CAPS,
    MGR_ID,
    MON_ID,
    OSD_BLOCK_BYTES,
    OSD_CAPS,
    RGW_NAME,
    CephPaths,
    CephPlan,
    ceph_key,
    mon_addrs,
    plan_ceph,
    render_conf,
    render_keyring,
)

PORT_NAMES = ("mon-v1", "mon-v2", "rgw", *monitoring.PORT_NAMES, *juicefs.PORT_NAMES)
# What `down` may stop when it finds one naming the run directory (started, not yet recorded).
PROGRAMS = frozenset(
    {
        "ceph-mon",
        "ceph-mgr",
        "ceph-osd",
        "radosgw",
        "radosgw-admin",
        "python",
        "monmaptool",
        monitoring.PROMETHEUS_BIN,
        monitoring.BLACKBOX_BIN,
        "redis-server",
        "juicefs",
    }
)
S3_USER = "gpufleet"
COMMAND_TIMEOUT_S = 60.0


class StorageSandboxError(RuntimeError):
    """A storage sandbox operation cannot proceed; the message says what to do."""


@dataclass
class StorageUpOptions:
    timeout_s: float = 180.0
    workload: bool = True  # the checkpoint writer and the backup job (writer.py, backup.py)
    python: str = sys.executable


class StorageRecorder:
    """The run's StorageSandboxState, persisted at every change (atomic replace)."""

    def __init__(self, state: StorageSandboxState, root: Path | None = None) -> None:
        self._state = state
        self._root = root
        # Re-entrant: add_* read and update under one hold. The OSDs are made in parallel threads,
        # and a read outside the update lost records (a fresh-clone CI run recorded 2 of 3 OSDs).
        self._lock = threading.RLock()
        self.path = write_storage_state(state, root)

    @property
    def state(self) -> StorageSandboxState:
        with self._lock:
            return self._state.model_copy(deep=True)

    def update(self, **fields: object) -> None:
        with self._lock:
            merged = {**self._state.model_dump(), **fields}
            self._state = StorageSandboxState.model_validate(merged)
            write_storage_state(self._state, self._root)

    def add_process(self, proc: SandboxProcess) -> None:
        with self._lock:
            self.update(processes=[*self._state.processes, proc])

    def add_osd(self, osd: OsdRecord) -> None:
        with self._lock:
            self.update(osds=sorted([*self._state.osds, osd], key=lambda o: o.id))


def existing_storage(stack: str, root: Path | None = None) -> tuple[StorageSandboxState | None, str | None]:
    """(state, None), (None, None) when there is no storage sandbox, or (None, why unreadable)."""
    path = storage_state_path(stack, root)
    if not path.exists():
        return None, None
    try:
        return read_storage_state(stack, root), None
    except (OSError, ValueError) as e:
        return None, f"{path}: {e}"


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  | " + "\n  | ".join(text) if text else ""


def run_command(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S, what: str | None = None) -> str:
    """Run a Ceph tool; its stdout, or StorageSandboxError with its stderr."""
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=processes.base_env()
        )
    except subprocess.TimeoutExpired:
        raise StorageSandboxError(
            f"{what or argv[0]} did not finish in {timeout_s:.0f} s: {' '.join(argv)}"
        ) from None
    if res.returncode != 0:
        err = (res.stderr or res.stdout).strip()[-800:]
        raise StorageSandboxError(
            f"{what or argv[0]} failed (exit {res.returncode}): {' '.join(argv)}\n{err}"
        )
    return res.stdout


# ----------------------------------------------------------------------------- bring-up


@dataclass
class _Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class _Run:
    paths: CephPaths
    rec: StorageRecorder
    deadline: float
    started: list[_Daemon] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def start(self, name: str, program: list[str]) -> None:
        recipe = Launch(program=program, env=processes.base_env(), log=str(self.paths.log(name)))
        popen, st = procs.launch(recipe)
        if st is None:
            popen.wait(timeout=5)
            raise StorageSandboxError(
                f"{name} exited at once with code {popen.returncode}; "
                f"see {recipe.log}{_tail(Path(recipe.log))}"
            )
        self.rec.add_process(SandboxProcess(name=name, pid=popen.pid, start_time=st, launch=recipe))
        with self.lock:
            self.started.append(_Daemon(name, popen, Path(recipe.log)))

    def check_alive(self) -> None:
        with self.lock:
            started = list(self.started)
        for d in started:
            code = d.popen.poll()
            if code is not None:
                ceph_log = self.paths.base / "log" / f"{_ceph_name(d.name)}.log"
                raise StorageSandboxError(
                    f"{d.name} exited with code {code} during bring-up; see {d.log}{_tail(d.log)}"
                    f"\n  and {ceph_log}{_tail(ceph_log)}"
                )

    def wait(self, what: str, check: Callable[[], Any], interval_s: float = 0.5) -> Any:
        def probe() -> Any:
            self.check_alive()
            return check()

        try:
            return wait_for(what, probe, self.left(), interval_s)
        except StorageSandboxError:
            raise
        except TimeoutError as e:
            raise StorageSandboxError(str(e)) from None


def _ceph_name(process: str) -> str:
    """Ceph's own name of a process (its log file's name): ceph-osd.0 -> osd.0, radosgw -> client.rgw.gw."""
    if process == "radosgw":
        return RGW_NAME
    return process.removeprefix("ceph-")


def storage_up(
    stack: str,
    spec: StackSpec,
    options: StorageUpOptions | None = None,
    root: Path | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[StorageRecorder, Timings]:
    """Bring the stack's storage sandbox up. On failure the state file (phase `failed`) still names
    everything started, so `down` removes it; the error names the log to read."""
    opts = options or StorageUpOptions()
    plan = plan_ceph(stack, spec)  # InputError before anything is made
    jplan = juicefs.plan_juicefs(stack, spec)
    if os.geteuid() != 0:
        raise StorageSandboxError("the storage sandbox runs Ceph daemons as root: run as root")
    prior, error = existing_storage(stack, root)
    if prior is not None or error is not None:
        which = f"run {prior.run_id}, phase {prior.phase}" if prior else error
        raise StorageSandboxError(
            f"a storage sandbox for stack {stack!r} already exists ({which}); "
            f"run `gpufleet sandbox down --storage --stack {stack}` first"
        )
    run_id = new_run_id()
    base = storage_state_path(stack, root).parent / f"run-{run_id}"
    timings = Timings()
    base.mkdir(parents=True, mode=0o700)
    rec = StorageRecorder(
        StorageSandboxState(
            stack=stack,
            run_id=run_id,
            phase="creating",
            base_dir=str(base),
            created_at=time.time(),
            ports=free_ports(PORT_NAMES),
            pool_size=plan.pool_size,
            pool_min_size=plan.pool_min_size,
        ),
        root,
    )
    watch = monitoring.MonitoringPlan(
        scrape_s=spec.sandbox_scrape_seconds,
        evaluation_s=duration_seconds(spec.monitoring.evaluation_interval),
        rule_file=repo_rule_file(),
        metadata_engine=jplan is not None,
    )
    try:
        run = _bring_up(plan, watch, rec, CephPaths(base), time.monotonic() + opts.timeout_s, timings, say)
        if jplan is not None:
            _juicefs(run, jplan, say)
            timings.mark("juicefs")
        if opts.workload:
            _workload(run, spec, opts.python, say)
            timings.mark("workload")
    except BaseException:
        rec.update(phase="failed")
        raise
    rec.update(phase="up")
    timings.mark("up")
    return rec, timings


def _write_keys(paths: CephPaths, osds: int) -> None:
    """One key per entity, in its own keyring (mode 0600); the monitor's seed keyring holds them all,
    so `ceph-mon --mkfs` starts the auth database with every daemon's key and caps."""
    now = int(time.time())
    entities = {name: (ceph_key(os.urandom(16), now), caps) for name, caps in CAPS.items()}
    entities.update({f"osd.{i}": (ceph_key(os.urandom(16), now), OSD_CAPS) for i in range(osds)})
    paths.keys.mkdir(mode=0o700)
    for name, entry in entities.items():
        if name != "mon.":
            _write_private(paths.keyring(name), render_keyring({name: entry}))
    _write_private(paths.keyring("seed"), render_keyring(entities))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _bring_up(
    plan: CephPlan,
    watch: monitoring.MonitoringPlan,
    rec: StorageRecorder,
    paths: CephPaths,
    deadline: float,
    timings: Timings,
    say: Callable[[str], None],
) -> _Run:
    state = rec.state
    fsid = str(uuid.uuid4())
    for d in ("run", "log", "mon", "mgr", "osd", "rgw"):
        (paths.base / d).mkdir(mode=0o700)
    paths.mgr_data().mkdir()
    _write_keys(paths, plan.osds)
    paths.conf.write_text(render_conf(fsid, paths, state.ports, plan))
    version = run_command(["ceph", "--version"]).strip()
    rec.update(fsid=fsid, ceph_conf=str(paths.conf), ceph_version=version)
    say(f"{version}; run {state.run_id}: 1 mon, 1 mgr, {plan.osds} OSDs, radosgw on 127.0.0.1")

    conf = str(paths.conf)
    run_command(
        [
            "monmaptool",
            "--create",
            "--fsid",
            fsid,
            "--addv",
            MON_ID,
            mon_addrs(state.ports),
            str(paths.monmap),
        ]
    )
    run_command(
        [
            "ceph-mon",
            "-c",
            conf,
            "--mkfs",
            "-i",
            MON_ID,
            "--monmap",
            str(paths.monmap),
            "--keyring",
            str(paths.keyring("seed")),
        ],
        what="ceph-mon --mkfs",
    )
    run = _Run(paths, rec, deadline)
    run.start(f"ceph-mon.{MON_ID}", ["ceph-mon", "-f", "-c", conf, "-i", MON_ID])
    run.start(f"ceph-mgr.{MGR_ID}", ["ceph-mgr", "-f", "-c", conf, "-i", MGR_ID])
    run.wait("the monitor's quorum", lambda: ceph_json(rec.state, "quorum_status", timeout_s=10))
    timings.mark("mon")

    def make_osd(i: int) -> None:
        osd_uuid = str(uuid.uuid4())
        data = paths.osd_data(i)
        data.mkdir(mode=0o700)
        rec.add_osd(
            OsdRecord(
                id=i,
                uuid=osd_uuid,
                data_dir=str(data),
                block=str(data / "block"),
                block_bytes=OSD_BLOCK_BYTES,
            )
        )
        run_command(rec.state.ceph_command("osd", "new", osd_uuid, str(i)), what=f"ceph osd new ({i})")
        run_command(
            ["ceph-osd", "-c", conf, "-i", str(i), "--mkfs", "--osd-uuid", osd_uuid],
            what=f"ceph-osd --mkfs (osd.{i})",
        )
        run.start(f"ceph-osd.{i}", ["ceph-osd", "-f", "-c", conf, "-i", str(i)])

    # In parallel: BlueStore's mkfs is most of an OSD's start-up (sandbox-notes.md, Storage).
    with ThreadPoolExecutor(max_workers=plan.osds) as pool:
        for f in [pool.submit(make_osd, i) for i in range(plan.osds)]:
            f.result()

    def osds_up() -> bool:
        stat = ceph_json(rec.state, "osd", "stat", timeout_s=10)
        return int(stat.get("num_up_osds", 0)) == plan.osds and int(stat.get("num_in_osds", 0)) == plan.osds

    run.wait(f"{plan.osds} OSDs up and in", osds_up)
    timings.mark("osds")
    say(f"ceph: {plan.osds} OSDs up")
    _enable_mgr_exporter(run, watch)

    run.start("radosgw", ["radosgw", "-f", "-c", conf, "-n", RGW_NAME])
    endpoint = f"http://127.0.0.1:{state.ports['rgw']}"
    with httpx.Client(timeout=2, trust_env=False) as http:
        run.wait(f"radosgw at {endpoint}", lambda: http.get(endpoint).status_code == 200)
    creds = S3Credentials(access_key=secrets.token_hex(10).upper(), secret_key=secrets.token_hex(20))
    run_command(
        [
            "radosgw-admin",
            "-c",
            conf,
            "user",
            "create",
            f"--uid={S3_USER}",
            "--display-name=gpufleet sandbox",
            f"--access-key={creds.access_key}",
            f"--secret={creds.secret_key}",
        ],
        what="radosgw-admin user create",
    )
    _write_private(paths.s3_credentials, creds.model_dump_json())
    rec.update(
        s3_endpoint=endpoint,
        s3_credentials=str(paths.s3_credentials),
        checkpoint_bucket=plan.object_store,
        backup_bucket=plan.backup_bucket,
    )
    client = s3.client(endpoint, creds.access_key, creds.secret_key)
    client.create_bucket(Bucket=plan.object_store)
    client.create_bucket(Bucket=plan.backup_bucket)
    # Versioned: a backup overwritten or deleted by mistake (or by a drill) can still be restored.
    client.put_bucket_versioning(Bucket=plan.backup_bucket, VersioningConfiguration={"Status": "Enabled"})
    timings.mark("rgw")
    say(f"radosgw: {endpoint}, buckets {plan.object_store} and {plan.backup_bucket} (versioned)")

    def healthy() -> bool:
        h = ceph_json(rec.state, "health", timeout_s=10)
        if h.get("status") == "HEALTH_OK":
            return True
        raise RuntimeError(f"{h.get('status')}: {', '.join(sorted((h.get('checks') or {}).keys()))}")

    run.wait("HEALTH_OK", healthy, 1.0)
    timings.mark("health_ok")
    _start_monitoring(run, watch)
    timings.mark("monitoring")
    say(f"prometheus: {rec.state.prometheus_url} (ceph-mgr's exporter, radosgw's probe, the catalog's rules)")
    return run


def _enable_mgr_exporter(run: _Run, watch: monitoring.MonitoringPlan) -> None:
    """Ceph's mgr `prometheus` module on 127.0.0.1, answering with the OSDs' series."""
    state = run.rec.state
    for key, value in monitoring.mgr_module_settings(watch, state.ports):
        # The monitor knows a module's options only once the manager has reported them: right after
        # the manager starts, `config set mgr mgr/prometheus/...` can be refused with "unrecognized
        # config option" (seen once here, in a benchmark's bring-up under load); retried until accepted.
        argv = state.ceph_command("config", "set", "mgr", key, value)
        run.wait(f"ceph config set mgr {key}", partial(run_command, argv, 15.0), 1.0)
    # Refused until the active manager has reported its modules (a few seconds after it starts).
    enable = state.ceph_command("mgr", "module", "enable", "prometheus")
    run.wait("the manager's prometheus module", lambda: run_command(enable, timeout_s=15) is not None, 1.0)
    url = f"http://127.0.0.1:{state.ports['mgr-prometheus']}/metrics"
    with httpx.Client(timeout=5, trust_env=False) as http:
        run.wait(f"ceph-mgr's exporter at {url}", lambda: "ceph_osd_up" in http.get(url).text, 1.0)


def _start_monitoring(run: _Run, watch: monitoring.MonitoringPlan) -> None:
    """The blackbox exporter and Prometheus, each from a recorded Launch recipe; waits until
    Prometheus has scraped both targets successfully."""
    state = run.rec.state
    assert state.s3_endpoint is not None
    d = Path(state.base_dir) / "monitoring"
    (d / "data").mkdir(parents=True)
    blackbox = d / "blackbox.yml"
    blackbox.write_text(monitoring.dump(monitoring.blackbox_config(watch.scrape_s), "blackbox exporter"))
    config = d / "prometheus.yml"
    engine = f"127.0.0.1:{state.ports['redis']}" if watch.metadata_engine else None
    client = f"127.0.0.1:{state.ports['juicefs-metrics']}" if watch.metadata_engine else None
    cfg = monitoring.prometheus_config(watch, state.ports, state.s3_endpoint, state.run_id, engine, client)
    config.write_text(monitoring.dump(cfg, "Prometheus"))
    run.start(monitoring.BLACKBOX, monitoring.blackbox_argv(blackbox, state.ports))
    run.start(monitoring.PROMETHEUS, monitoring.prometheus_argv(config, d / "data", state.ports))
    url = f"http://127.0.0.1:{state.ports['prometheus']}"

    def scraped() -> bool:
        up = {t["labels"]["job"] for t in prom_api.targets() if t["health"] == "up"}
        return up >= {monitoring.CEPH_JOB, monitoring.OBJECT_STORE_JOB}

    with PrometheusClient(url, timeout=5) as prom_api:
        run.wait(f"Prometheus at {url} with both targets up", scraped, 1.0)
    run.rec.update(prometheus_url=url)


def _juicefs(run: _Run, plan: juicefs.JuiceFsPlan, say: Callable[[str], None]) -> None:
    """Redis, the volume formatted on radosgw, the mount (juicefs.py), recorded in the state file."""
    state = run.rec.state
    assert state.s3_endpoint is not None
    rec = juicefs.record_for(plan, Path(state.base_dir), state.ports)
    run.rec.update(juicefs=rec.model_dump())
    creds = state.credentials()
    client = s3.client(state.s3_endpoint, creds.access_key, creds.secret_key)
    juicefs.bring_up(run, rec, state.s3_endpoint, creds, lambda b: client.create_bucket(Bucket=b))
    where = f"; checkpoints in {rec.checkpoint_dir}" if rec.checkpoint_dir else ""
    say(f"juicefs: {rec.name} on {state.s3_endpoint}/{rec.bucket}, metadata in {rec.meta_url}, "
        f"mounted at {rec.mountpoint}{where}")


WRITER = "checkpoint-writer"
BACKUP = "backup"
METADATA_BACKUP = "metadata-backup"


def workload_events(state: StorageSandboxState, name: str) -> Path:
    return state.events_file(name)


def _workload(run: _Run, spec: StackSpec, python: str, say: Callable[[str], None]) -> None:
    """The checkpoint writer (every storage.checkpoint.intervalMinutes) and the backup job (every
    dr.backupIntervalSeconds), each from a recorded Launch recipe; waits for a first checkpoint."""
    state = run.rec.state
    state_file = str(run.rec.path)
    every = spec.storage.checkpoint.interval_minutes * 60
    backup_every = spec.dr.backup_interval_seconds if spec.dr is not None else 60.0
    run.start(
        WRITER,
        [
            python,
            "-m",
            "gpufleet.sandbox.storage.writer",
            "--state-file",
            state_file,
            "--events",
            str(workload_events(state, WRITER)),
            "--interval",
            f"{every:g}",
        ],
    )
    run.start(
        BACKUP,
        [
            python,
            "-m",
            "gpufleet.sandbox.storage.backup",
            "--state-file",
            state_file,
            "--events",
            str(workload_events(state, BACKUP)),
            "--interval",
            f"{backup_every:g}",
        ],
    )
    if state.juicefs is not None:
        run.start(
            METADATA_BACKUP,
            [
                python,
                "-m",
                "gpufleet.sandbox.storage.metadata_backup",
                "--state-file",
                state_file,
                "--events",
                str(workload_events(state, METADATA_BACKUP)),
                "--interval",
                f"{backup_every:g}",
            ],
        )
    from gpufleet.sandbox.storage.writer import read_events

    def saved() -> bool:
        return any(e.get("event") == "checkpoint" for e in read_events(workload_events(state, WRITER)))

    where = state.juicefs.checkpoint_dir if state.juicefs and state.juicefs.checkpoint_dir else None
    where = where or state.checkpoint_bucket
    run.wait(f"a first checkpoint in {where}", saved, 0.5)
    say(
        f"checkpoint writer: every {every:g} s to {where}; "
        f"backups every {backup_every:g} s to {state.backup_bucket}"
        + (" (checkpoints and verified metadata dumps)" if state.juicefs else "")
    )


def ceph_json(state: StorageSandboxState, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """A `ceph ... --format json` admin command's answer (StorageSandboxError when it fails)."""
    try:
        return ceph_admin.ceph_json(state, *args, timeout_s=timeout_s)
    except ceph_admin.CephCommandError as e:
        raise StorageSandboxError(str(e)) from None


# ----------------------------------------------------------------------------- down


# Prometheus and the probe first (they would record the rest going away), the S3 clients, then
# radosgw, the OSDs, the manager, the monitor last (the others talk to it); anything else after them.
STOP_ORDER: tuple[str | None, ...] = (
    monitoring.PROMETHEUS,
    monitoring.BLACKBOX,
    WRITER,
    BACKUP,
    METADATA_BACKUP,
    # the mount is unmounted before this list is walked (storage_down); its process, then Redis
    juicefs.MOUNT,
    juicefs.REDIS_SCRATCH,
    juicefs.REDIS,
    "radosgw",
    "ceph-osd.",
    "ceph-mgr.",
    "ceph-mon.",
    None,
)


def storage_down(
    stack: str, root: Path | None = None, keep_files: bool = False, grace_s: float = 10.0
) -> RunDownReport | None:
    """Remove a stack's storage sandbox (any phase, idempotent). None if there is none."""
    state, error = existing_storage(stack, root)
    if state is None:
        if error is not None:
            raise StorageSandboxError(f"unreadable state file {error}; remove the run by hand")
        return None
    deleting = state.model_copy(update={"phase": "deleting"})
    if state.juicefs is not None:
        write_storage_state(deleting, root)
        _unmount_first(state, grace_s)
    return run_teardown.remove_run(
        state,
        storage_state_path(stack, root),
        lambda: write_storage_state(deleting, root),
        STOP_ORDER,
        PROGRAMS,
        grace_s,
        keep_files,
    )


def _unmount_first(state: StorageSandboxState, grace_s: float) -> None:
    """Stop the mount's users, then unmount it (lazily when it is busy or its client is dead:
    "Transport endpoint is not connected"), so removing the run folder never walks into it."""
    assert state.juicefs is not None
    users = {
        p.pid: p.start_time
        for p in state.processes
        if p.name in (WRITER, BACKUP, METADATA_BACKUP) and processes.alive(p)
    }
    mountpoint = Path(state.juicefs.mountpoint)
    connection = jfs.fuse_connection(mountpoint)
    # A user blocked on a dead client is unkillable until the FUSE connection is aborted.
    if processes.stop_pids(users, grace_s) and connection is not None:
        jfs.abort_fuse(connection)
        processes.stop_pids(users, grace_s)
    if jfs.mounted(mountpoint):
        done = subprocess.run(["umount", str(mountpoint)], capture_output=True, timeout=30).returncode == 0
        if not done:
            if connection is not None:
                jfs.abort_fuse(connection)
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=30)
    try:
        mounts.unbind(mountpoint.parent)  # juicefs.bring_up made it a shared mount
    except (mounts.MountError, subprocess.TimeoutExpired) as e:
        raise StorageSandboxError(f"{e}; unmount {mountpoint.parent} by hand") from None


# ----------------------------------------------------------------------------- status


def storage_status(state: StorageSandboxState) -> dict[str, Any]:
    """Live facts: which daemons run, their memory, and Ceph's health."""
    out: dict[str, Any] = {
        "stack": state.stack,
        "run_id": state.run_id,
        "phase": state.phase,
        "base_dir": state.base_dir,
        "ceph_version": state.ceph_version,
        "s3_endpoint": state.s3_endpoint,
        "prometheus_url": state.prometheus_url,
        "buckets": [b for b in (state.checkpoint_bucket, state.backup_bucket) if b],
        "processes": {p.name: processes.alive(p) for p in state.processes},
        "rss_bytes": {
            p.name: processes.rss_bytes(p.pid) if processes.alive(p) else 0 for p in state.processes
        },
        "health": None,
        "error": None,
    }
    if state.juicefs is not None:
        out["juicefs"] = {
            "mountpoint": state.juicefs.mountpoint,
            "mounted": jfs.mounted(Path(state.juicefs.mountpoint)),
            "meta_url": state.juicefs.meta_url,
            "bucket": state.juicefs.bucket,
            "checkpoint_dir": state.juicefs.checkpoint_dir,
        }
    if state.ceph_conf is None:
        return out
    try:
        h = ceph_json(state, "health", timeout_s=15)
        out["health"] = {"status": h.get("status"), "checks": sorted((h.get("checks") or {}).keys())}
    except (StorageSandboxError, ValueError) as e:
        out["error"] = str(e)
    return out


def all_storage_stacks(root: Path | None = None) -> list[str]:
    from gpufleet.core.sandbox_contract import state_root

    r = root or state_root()
    if not r.is_dir():
        return []
    return sorted(p.parent.parent.name for p in r.glob("*/storage/state.json"))
