"""The job script (rendering, absolute paths, no requeue) and the Slurm task environment."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.sandbox.training.jobscript import JobParams, render_job_script, train_args
from gpufleet.sandbox.training.slurmenv import expand_hostlist, rank_info
from gpufleet.sandbox.training.train import build_parser


def params(**kw: object) -> JobParams:
    base = dict(python="/opt/venv/bin/python", base_dir="/run/sb", checkpoint_dir="/run/sb/ckpt",
                events_file="/run/sb/training/events.jsonl", file_sd_dir="/run/sb/prometheus/file_sd",
                hosts_file="/run/sb/hosts.json", nodes=3, ranks_per_node=1, checkpoint_every_steps=7,
                pg_timeout=10)
    base.update(kw)
    return JobParams.model_validate(base)


def test_script_is_valid_bash_with_absolute_commands() -> None:
    text = render_job_script(params())
    assert text.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "#SBATCH --nodes=3" in text
    srun = next(ln for ln in text.splitlines() if ln.startswith("/usr/bin/srun "))
    assert "--kill-on-bad-exit=1" in srun and "--export=ALL" in srun
    launch = text[text.index("/usr/bin/srun"):text.index("rc=$?")].replace("\\\n", " ")
    argv = shlex.split(launch)
    assert argv[argv.index("-m") - 1] == "/opt/venv/bin/python"
    assert argv[argv.index("-m") + 1] == "gpufleet.sandbox.training.train"
    # The rank's flags parse with the trainer's own parser and carry the params.
    ns = build_parser().parse_args(argv[argv.index("-m") + 2:])
    assert ns.checkpoint_every == 7 and ns.pg_timeout == 10.0 and str(ns.hosts_file) == "/run/sb/hosts.json"
    # Every command the script runs is an absolute path (jobs get no PATH with --export=NONE).
    for ln in text.splitlines():
        s = ln.strip()
        if s and not s.startswith(("#", "if", "fi", "exit", "echo", "export", "incarnation=", "rc=",
                                   "then", "else", "set ", '"')) and not s.startswith("--"):
            first = shlex.split(s.rstrip("\\"))[0]
            assert first.startswith("/"), ln


def test_paths_must_be_absolute_and_quoted() -> None:
    with pytest.raises(ValidationError, match="absolute"):
        params(checkpoint_dir="ckpt")
    with pytest.raises(ValidationError, match="absolute"):
        params(srun="srun")
    text = render_job_script(params(base_dir="/run/with space"))
    assert "export HOME='/run/with space'" in text
    quoted = " ".join(shlex.quote(a) for a in train_args(params(base_dir="/run/with space")))
    assert "'/run/with space'" in quoted and "'/run/with space'" in text


def run_script(tmp_path: Path, srun_rc: int, incarnation: str | None) -> tuple[int, str, str]:
    """Run the rendered script with a fake srun that records its environment."""
    log = tmp_path / "calls.log"
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/bash\necho srun inc=$GPUFLEET_INCARNATION \"$@\" >> {log}\nexit {srun_rc}\n")
    srun.chmod(0o755)
    text = render_job_script(params(srun=str(srun)))
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu-[0-2]"}
    if incarnation is not None:
        env["GPUFLEET_INCARNATION"] = incarnation
    res = subprocess.run(["/bin/bash", "-c", text], env=env, capture_output=True, text=True, timeout=30)
    return res.returncode, log.read_text(), res.stdout


def test_script_never_requeues_and_passes_its_incarnation_to_the_ranks(tmp_path: Path) -> None:
    text = render_job_script(params())
    assert "#SBATCH --no-requeue" in text and "scontrol" not in text
    rc, calls, out = run_script(tmp_path, srun_rc=3, incarnation="4")
    assert rc == 3 and "srun inc=4 --kill-on-bad-exit=1" in calls and "incarnation 4" in out
    (tmp_path / "calls.log").unlink()
    rc, calls, out = run_script(tmp_path, srun_rc=0, incarnation=None)
    assert rc == 0 and "srun inc=0 " in calls and "training finished" in out


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu-0", ["gpu-0"]),
        ("gpu-[0-2]", ["gpu-0", "gpu-1", "gpu-2"]),
        ("n[08-10],spare-0", ["n08", "n09", "n10", "spare-0"]),
        ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
        ("a,b[3]", ["a", "b3"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["gpu-[0-2", "gpu-0]", "gpu-[3-1]", "gpu-[a-b]"])
def test_expand_hostlist_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_rank_info() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
           "SLURMD_NODENAME": "gpu-2", "SLURM_JOB_NODELIST": "gpu-[1-2]", "SLURM_JOB_ID": "42",
           "SLURM_RESTART_COUNT": "3"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.job_id, info.restart) == (1, 2, 0, 42, 3)
    assert info.master_node == "gpu-1"
    assert rank_info({**env, "SLURM_RESTART_COUNT": ""}).restart == 0
    # The auto-resume controller's incarnation wins over Slurm's requeue count.
    assert rank_info({**env, "GPUFLEET_INCARNATION": "7"}).restart == 7
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        rank_info({k: v for k, v in env.items() if k != "SLURM_PROCID"})
    with pytest.raises(ValueError, match="not in SLURM_JOB_NODELIST"):
        rank_info({**env, "SLURMD_NODENAME": "gpu-9"})
