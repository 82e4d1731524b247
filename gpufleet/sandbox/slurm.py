"""Running real Slurm in the sandbox: munged (root namespace, reached by socket path), slurmctld in
the head namespace, one slurmd per node namespace; and reading node and job states back."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo
from gpufleet.sandbox import boot, configs
from gpufleet.sandbox.layout import Layout
from gpufleet.sandbox.processes import Started, spawn

MUNGE_KEY_BYTES = 1024  # mungekey(8)'s default key size


def write_configs(layout: Layout, gpufleet_bin: Path) -> None:
    d = layout.slurm_conf.parent
    d.mkdir(parents=True, exist_ok=True)
    (d / "ctld").mkdir(exist_ok=True)
    layout.slurm_conf.write_text(configs.slurm_conf(layout, gpufleet_bin))
    # Slurm reads cgroup.conf and gres.conf from the directory of slurm.conf.
    (d / "cgroup.conf").write_text(configs.cgroup_conf(layout))
    (d / "gres.conf").write_text(configs.gres_conf(layout))
    layout.health_script.write_text(configs.health_script(layout, gpufleet_bin))
    layout.health_script.chmod(0o755)
    layout.epilog_script.write_text(configs.health_script(layout, gpufleet_bin, epilog=True))
    layout.epilog_script.chmod(0o755)
    reboot = configs.reboot_script_path(layout)
    reboot.write_text(configs.reboot_script(layout, gpufleet_bin))
    reboot.chmod(0o755)
    for n in layout.nodes:
        layout.spool_dir(n.name).mkdir(parents=True, exist_ok=True)
        make_gpu_devices(layout.node_dir(n.name) / "dev", n.gpus)


def make_gpu_devices(d: Path, count: int) -> None:
    """Fake GPU device nodes for gres.conf: Slurm rejects regular files (sandbox-notes.md, 3)."""
    d.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = d / f"nvidia{i}"
        if not path.exists():
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


def start_munged(layout: Layout) -> Started:
    d = layout.munge_socket.parent
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)  # munged refuses a socket directory with any other mode (sandbox-notes.md, 1)
    key = d / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(MUNGE_KEY_BYTES))
    argv = [
        "munged",
        "--foreground",
        "--force",  # runs as root here; munged otherwise insists on its own user
        f"--socket={layout.munge_socket}",
        f"--key-file={key}",
        f"--pid-file={d / 'munged.pid'}",
        f"--log-file={d / 'munged.log'}",
        f"--seed-file={d / 'munged.seed'}",
        "--num-threads=4",
    ]
    return spawn("munged", argv, d / "munged.out")


def _env(layout: Layout) -> dict[str, str]:
    return {"SLURM_CONF": str(layout.slurm_conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def start_slurmctld(layout: Layout) -> Started:
    argv = ["slurmctld", "-D", "-i", "-f", str(layout.slurm_conf)]
    return spawn(
        "slurmctld",
        argv,
        layout.path("slurm", "slurmctld.out"),
        netns=layout.head.netns,
        hostname=layout.head.name,
        env=_env(layout),
    )


def start_slurmd(layout: Layout, node: str) -> Started:
    # In a time namespace of its own that starts at the node's boot, so that `scontrol reboot`
    # can complete (gpufleet.sandbox.boot, ADR 0064).
    argv = boot.booted(["slurmd", "-D", "-N", node, "-f", str(layout.slurm_conf)],
                        boot.node_boot_offset(layout.node(node).netns))
    return spawn(
        f"slurmd@{node}",
        argv,
        layout.node_dir(node) / "slurmd.out",
        netns=layout.node(node).netns,
        hostname=node,
        env=_env(layout),
    )


# --------------------------------------------------------------------------- reading Slurm back


def slurm_argv(layout_or_netns: str, slurm_conf: Path, *args: str) -> list[str]:
    return ["ip", "netns", "exec", layout_or_netns, "env", f"SLURM_CONF={slurm_conf}", *args]


def run_slurm(
    netns: str, slurm_conf: Path, *args: str, timeout: float = 15
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        slurm_argv(netns, slurm_conf, *args), capture_output=True, text=True, timeout=timeout
    )


def node_states(netns: str, slurm_conf: Path) -> dict[str, NodeObs]:
    res = run_slurm(netns, slurm_conf, *SINFO_ARGS)
    if res.returncode != 0:
        return {}
    return parse_sinfo(res.stdout)


def all_idle(states: dict[str, NodeObs], nodes: list[str]) -> bool:
    return all(n in states and states[n].base_state == "idle" and states[n].responding for n in nodes)


@dataclass(frozen=True)
class JobState:
    job_id: str
    name: str
    state: str
    nodes: str


def parse_squeue(text: str) -> list[JobState]:
    """Parse `squeue -h -o %i|%j|%T|%N`."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            out.append(JobState(parts[0].strip(), parts[1].strip(), parts[2].strip(), parts[3].strip()))
    return out


def jobs(netns: str, slurm_conf: Path) -> list[JobState]:
    res = run_slurm(netns, slurm_conf, "squeue", "-h", "-o", "%i|%j|%T|%N")
    if res.returncode != 0:
        return []
    return parse_squeue(res.stdout)
