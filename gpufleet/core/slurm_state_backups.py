"""Backups of slurmctld's StateSaveLocation, proven in a scratch slurmctld, and their restore (the
Slurm sandbox's backup job and the chaos backend's restore share these; decisions are in
core.slurm_backup_checks).

A consistent copy: Slurm's upgrade guide has the state directory backed up with slurmctld shut
down (https://slurm.schedmd.com/upgrades.html); a periodic backup cannot stop the controller, so it
pauses it instead (SIGSTOP for the milliseconds of the copy, SIGCONT after). slurmctld writes each
state file to `<name>.new` and renames it over `<name>` when complete (dump_all_job_state in
src/slurmctld/job_mgr.c), so with the process stopped every `<name>` is its last complete save and a
`.new` is a write cut off by the pause, left out. Before pausing, the job waits until the controller
has saved every job it lists (job_state newer than the newest submission), so the copy holds them.

Each copy is archived (tar.gz) with its sha256, loaded by a scratch slurmctld (`-D -R`: recover
the full state, jobs, nodes and partitions, slurmctld(8); without `-i` an unreadable state file
stops it) on its own port in the head namespace, listed with `squeue`, stopped, and judged; the
evidence is written beside the archive whatever the verdict.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import time
from datetime import datetime
from pathlib import Path

from gpufleet.core.procs import alive, launch
from gpufleet.core.sandbox_contract import Launch, SandboxProcess, SandboxState
from gpufleet.core.slurm_backup_checks import (
    ARCHIVE_PREFIX,
    EVIDENCE_SUFFIX,
    SQUEUE_FORMAT,
    JobEntry,
    StateBackupEvidence,
    archive_name,
    conf_value,
    evidence_name,
    judge_state_backup,
    parse_jobs,
    scratch_conf,
    to_prune,
)

BACKUP_FOLDER = "state-backups"  # under <run>/slurm/
KEEP = 20
SCRATCH_PORT_OFFSET = 100  # the scratch controller's ports: the live ones + this, in the head namespace
SCRATCH_LOAD_TIMEOUT_S = 30.0
SAVE_WAIT_S = 10.0  # slurmctld saves job state within seconds of a change (its state-save thread)
SQUEUE_TIMEOUT_S = 10.0


class SlurmBackupError(RuntimeError):
    """No backup could be taken or restored; the message says why."""


def backup_dir(state: SandboxState) -> Path:
    return Path(state.base_dir) / "slurm" / BACKUP_FOLDER


def state_save_location(state: SandboxState) -> Path:
    if state.slurm_conf is None:
        raise SlurmBackupError("this sandbox has no Slurm controller")
    where = conf_value(Path(state.slurm_conf).read_text(), "StateSaveLocation")
    if where is None:
        raise SlurmBackupError(f"{state.slurm_conf} names no StateSaveLocation")
    return Path(where)


def controller(state: SandboxState) -> SandboxProcess | None:
    return next((p for p in state.processes if p.name == "slurmctld"), None)


def squeue_all(netns: str, conf: str) -> list[JobEntry] | None:
    """Every job the controller of `conf` knows, ended ones too (None: it did not answer)."""
    argv = ["ip", "netns", "exec", netns, "env", f"SLURM_CONF={conf}",
            "squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None
    return parse_jobs(cp.stdout) if cp.returncode == 0 else None


def live_jobs(state: SandboxState) -> list[JobEntry] | None:
    if state.head_netns is None or state.slurm_conf is None:
        return None
    return squeue_all(state.head_netns, state.slurm_conf)


def _submitted_at(job: JobEntry) -> float | None:
    try:
        return datetime.fromisoformat(job.submitted).timestamp()  # squeue prints local time
    except ValueError:
        return None


def wait_saved(state_dir: Path, jobs: list[JobEntry], timeout_s: float = SAVE_WAIT_S) -> bool:
    """Wait until job_state was written after the newest listed submission (%V has whole seconds,
    so after the end of its second). False when it was not within `timeout_s`."""
    newest = max((t for t in map(_submitted_at, jobs) if t is not None), default=None)
    if newest is None:
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (state_dir / "job_state").stat().st_mtime >= newest + 1:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def copy_paused(ctl: SandboxProcess, src: Path, dst: Path) -> float:
    """Copy the state directory with slurmctld stopped; the seconds it was stopped."""
    if not alive(ctl.pid, ctl.start_time):
        raise SlurmBackupError("slurmctld is not running: nothing consistent to copy")
    t0 = time.monotonic()
    os.kill(ctl.pid, signal.SIGSTOP)
    try:
        shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("*.new"))
    finally:
        os.kill(ctl.pid, signal.SIGCONT)
    return time.monotonic() - t0


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _archive(src: Path, dst: Path) -> int:
    """tar.gz of src's contents at dst (written beside, renamed when complete); its file count."""
    part = dst.with_name(dst.name + ".part")
    files = 0
    with tarfile.open(part, "w:gz") as tar:
        for p in sorted(src.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(src)), recursive=False)
            files += p.is_file()
    os.replace(part, dst)
    return files


def _extract(archive: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(dst, filter="data")


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def verify_in_scratch(
    state: SandboxState, archive: Path, work: Path
) -> tuple[list[JobEntry] | None, str | None, float | None]:
    """Load the archive in a scratch slurmctld and list its jobs: (jobs, why not, seconds to load)."""
    ctl = controller(state)
    if ctl is None or state.slurm_conf is None or state.head_netns is None:
        return None, "the sandbox records no slurmctld to copy the launch of", None
    shutil.rmtree(work, ignore_errors=True)
    ctld = work / "ctld"
    try:
        _extract(archive, ctld)
    except (OSError, tarfile.TarError) as e:
        return None, f"the archive does not extract: {e}", None
    live_conf = Path(state.slurm_conf)
    text = live_conf.read_text()
    port = int(conf_value(text, "SlurmctldPort") or 6817) + SCRATCH_PORT_OFFSET
    slurmd_port = int(conf_value(text, "SlurmdPort") or 6818) + SCRATCH_PORT_OFFSET
    conf = work / "slurm.conf"
    conf.write_text(scratch_conf(text, {
        "SlurmctldPort": str(port), "SlurmdPort": str(slurmd_port), "StateSaveLocation": str(ctld),
        "SlurmctldPidFile": str(work / "slurmctld.pid"), "SlurmctldLogFile": str(work / "slurmctld.log"),
    }))
    for extra in ("cgroup.conf", "gres.conf"):  # read from slurm.conf's folder
        if (live_conf.parent / extra).exists():
            shutil.copy(live_conf.parent / extra, work / extra)
    recipe = Launch(
        program=["slurmctld", "-D", "-R", "-f", str(conf)],
        netns=ctl.launch.netns,
        hostname=ctl.launch.hostname,  # slurmctld runs only on the host SlurmctldHost names
        env={**ctl.launch.env, "SLURM_CONF": str(conf)},
        log=str(work / "slurmctld.out"),
    )
    t0 = time.monotonic()
    popen, _ = launch(recipe)
    try:
        while time.monotonic() - t0 < SCRATCH_LOAD_TIMEOUT_S:
            if popen.poll() is not None:
                return None, (f"scratch slurmctld exited ({popen.returncode}): "
                              f"{_tail(work / 'slurmctld.log') or _tail(work / 'slurmctld.out')}"), None
            jobs = squeue_all(state.head_netns, str(conf))
            if jobs is not None:
                return jobs, None, round(time.monotonic() - t0, 3)
            time.sleep(0.3)
        return None, f"scratch slurmctld did not answer squeue within {SCRATCH_LOAD_TIMEOUT_S:g} s", None
    finally:
        _stop(popen)


def list_evidence(folder: Path) -> list[StateBackupEvidence]:
    """Every backup's evidence in the folder, oldest first (unreadable ones skipped)."""
    out = []
    for p in folder.glob(f"{ARCHIVE_PREFIX}*{EVIDENCE_SUFFIX}"):
        try:
            out.append(StateBackupEvidence.model_validate_json(p.read_bytes()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda e: (e.taken_at, e.archive))


def _write_evidence(folder: Path, evidence: StateBackupEvidence) -> None:
    path = folder / evidence_name(evidence.archive)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(evidence.model_dump_json(indent=1))
    os.replace(tmp, path)


def prune(folder: Path, keep: int = KEEP) -> None:
    for e in to_prune(list_evidence(folder), keep):
        for name in (e.archive, evidence_name(e.archive)):
            (folder / name).unlink(missing_ok=True)


def take_backup(state: SandboxState, previous: StateBackupEvidence | None) -> StateBackupEvidence:
    """One backup of the controller's state, proven (or not) in a scratch controller."""
    ctl = controller(state)
    if ctl is None or not alive(ctl.pid, ctl.start_time):
        raise SlurmBackupError("slurmctld is not running")
    src = state_save_location(state)
    folder = backup_dir(state)
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / ".work"
    before = live_jobs(state)
    if before is None:
        raise SlurmBackupError("the live controller did not answer squeue")
    t0 = time.monotonic()
    saved = wait_saved(src, before)
    taken_at = time.time()
    shutil.rmtree(work / "copy", ignore_errors=True)
    work.mkdir(exist_ok=True)
    paused = copy_paused(ctl, src, work / "copy")
    after = live_jobs(state) or []
    name = archive_name(taken_at)
    files = _archive(work / "copy", folder / name)
    loaded, error, load_s = verify_in_scratch(state, folder / name, work / "scratch")
    problems = judge_state_backup(loaded, error, [j.id for j in before], [j.id for j in after],
                                  previous.jobs_count() if previous else None)
    if not saved:
        problems.append(f"job_state was not saved after the newest submission within {SAVE_WAIT_S:g} s")
    evidence = StateBackupEvidence(
        archive=name, taken_at=taken_at, seconds=round(time.monotonic() - t0, 3),
        paused_seconds=round(paused, 4), bytes=(folder / name).stat().st_size, files=files,
        sha256=sha256_file(folder / name), verified=not problems, jobs=loaded or [],
        live_before=[j.id for j in before], live_after=[j.id for j in after], load_seconds=load_s,
        previous=previous.archive if previous else None,
        previous_jobs=previous.jobs_count() if previous else None, problems=problems,
    )
    _write_evidence(folder, evidence)
    prune(folder)
    return evidence


def restore_newest(folder: Path, target: Path) -> StateBackupEvidence:
    """Extract the newest verified backup of `folder` whose archive still matches its sha256 into
    `target` (which must not exist). SlurmBackupError when there is none."""
    candidates = sorted((e for e in list_evidence(folder) if e.verified), key=lambda e: e.taken_at,
                        reverse=True)
    why = []
    for e in candidates:
        archive = folder / e.archive
        if not archive.exists() or sha256_file(archive) != e.sha256:
            why.append(f"{e.archive}: missing or its sha256 differs from the evidence")
            continue
        tmp = target.with_name(target.name + ".restoring")
        shutil.rmtree(tmp, ignore_errors=True)
        _extract(archive, tmp)
        os.replace(tmp, target)
        return e
    detail = f" ({'; '.join(why)})" if why else ""
    raise SlurmBackupError(f"no verified backup to restore in {folder}{detail}")

