"""A rank's place in the job, from the environment Slurm gives each task (srun(1), "OUTPUT
ENVIRONMENT VARIABLES"); Slurm's hostlist syntax is gpufleet.core.slurm_state's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.core.slurm_state import expand_hostlist

__all__ = ["RankInfo", "expand_hostlist", "rank_info"]


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    node_index: int
    local_rank: int
    node: str
    nodes: tuple[str, ...]
    job_id: int
    restart: int
    gpus: tuple[int, ...] = ()  # the GPUs of this node the job holds (empty: only local_rank's)

    @property
    def master_node(self) -> str:
        return self.nodes[0]


def rank_info(env: Mapping[str, str]) -> RankInfo:
    """Read a task's Slurm environment; raises ValueError naming what is missing."""
    need = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME",
            "SLURM_JOB_NODELIST", "SLURM_JOB_ID"]
    missing = [k for k in need if k not in env]
    if missing:
        raise ValueError(f"not a Slurm task: {', '.join(missing)} unset (run under srun)")
    nodes = tuple(expand_hostlist(env["SLURM_JOB_NODELIST"]))
    info = RankInfo(
        rank=int(env["SLURM_PROCID"]),
        world_size=int(env["SLURM_NTASKS"]),
        node_index=int(env["SLURM_NODEID"]),
        local_rank=int(env["SLURM_LOCALID"]),
        node=env["SLURMD_NODENAME"],
        nodes=nodes,
        job_id=int(env["SLURM_JOB_ID"]),
        # The auto-resume controller numbers incarnations (each a new job); Slurm's own requeue
        # count is the fallback for a job submitted by hand with --requeue.
        restart=int(env.get("GPUFLEET_INCARNATION") or env.get("SLURM_RESTART_COUNT") or 0),
    )
    info = dataclasses.replace(info, gpus=held_gpus(env, info.local_rank))
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"SLURM_PROCID {info.rank} outside 0..{info.world_size - 1}")
    if info.node not in nodes:
        raise ValueError(f"SLURMD_NODENAME {info.node} is not in SLURM_JOB_NODELIST {nodes}")
    return info


def held_gpus(env: Mapping[str, str], local_rank: int) -> tuple[int, ...]:
    """The GPUs of its node a task's job holds: Slurm's SLURM_STEP_GPUS / SLURM_JOB_GPUS (set for a
    GRES with device files, gres.conf(5)), else CUDA_VISIBLE_DEVICES, else the local rank's GPU."""
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(key, "").strip()
        if raw:
            try:
                return tuple(sorted({int(x) for x in raw.split(",") if x.strip()}))
            except ValueError:
                continue  # e.g. GPU UUIDs in CUDA_VISIBLE_DEVICES: no index to watch
    return (local_rank,)
