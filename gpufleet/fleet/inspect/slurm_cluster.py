"""The inspect source of a Slurm cluster: every node inspects itself, one sweep reads them all
(docs/fleet-inspect.md, "On a Slurm cluster"; ADR 0088).

A node's own `gpufleet inspect --here --publish-dir DIR` (from its HealthCheckProgram wrapper or a
timer) writes its observation, the NodeObservation every check takes, to `DIR/inspect-<node>.json`
(gpufleet.core.inspect_contract), DIR being a folder of the cluster's shared file system.
`gpufleet inspect --slurm --publish-dir DIR`, run where Slurm's client commands work (a login or
controller host), reads the nodes from `sinfo`, the jobs from `scontrol -o show job`, and the files,
and judges every node of the stack's pools with the same checks, history and lemon rules as the other
backends, as the Kubernetes sweep does (cluster.py):
- a node's pool comes from the stack and Slurm, not from what the node said of itself: the pool whose
  static `provisioning.nodeNames` lists the node, else the pool named by one of the node's Slurm
  features (`Features=` in slurm.conf), else by one of its partitions; the first pool of the stack
  matching wins. A node of no pool is not swept;
- the scheduler's view (idle, mixed, allocated, draining, drained, down) is sinfo's long state;
- a node that published nothing, something unreadable or about another node, or last published
  more than `max_age_s` ago is UNKNOWN with the reason: old readings are not judged as today's;
- the jobs that excluded a node since its previous sweep come from ExcNodeList (exclusions.py,
  from the text `read_slurm_jobs` returns).

Why files rather than running `inspect --here` on each node through srun: a job step needs the
node's resources, and the light checks must read every node, the busy ones included; slurmd runs
its HealthCheckProgram on every node whatever its jobs, so the nodes write and the sweep reads.

`parse_slurm_nodes`, `pool_of`, `sched_state_of` and `observations_from_slurm` are pure;
`write_published`, `read_published`, `read_slurm_nodes` and `read_slurm_jobs` are the I/O.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.inspect_contract import DEFAULT_MAX_AGE_S, PUBLISHED_MAX_BYTES, published_file_name
from gpufleet.core.slurm_state import SINFO_FORMAT, parse_sinfo
from gpufleet.fleet.inspect.cluster import PoolShape, judge_published
from gpufleet.fleet.inspect.observation import NodeObservation, SchedState

# sinfo's node lines with the partition and the available features (sinfo(1): %P, %f); a node in two
# partitions has two lines.
SINFO_NODE_ARGS = ("sinfo", "-h", "-N", "-o", SINFO_FORMAT + "|%P|%f")
JOBS_ARGS = ("scontrol", "-o", "show", "job")
SLURM_TIMEOUT_S = 30.0
NOT_PUBLISHED = "no inspect result published by the node (`gpufleet inspect --here --publish-dir`)"


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # sinfo's long state without its flags, e.g. "drained"
    partitions: frozenset[str]
    features: frozenset[str]


@dataclass(frozen=True)
class SlurmPool:
    """A pool of the stack, and how Slurm's nodes are matched to it."""

    name: str
    shape: PoolShape
    node_names: frozenset[str] = frozenset()  # the pool's static provisioning.nodeNames


def sched_state_of(slurm_state: str | None) -> SchedState:
    """A Slurm long state (sinfo %T, flags stripped) -> the plan's vocabulary."""
    if slurm_state is None:
        return "unknown"
    s = slurm_state.strip().lower().rstrip("*~#!%$@^-")
    table: dict[str, SchedState] = {"idle": "idle", "allocated": "allocated", "mixed": "mixed",
                                    "drained": "drained", "draining": "draining", "down": "down",
                                    "completing": "allocated"}
    return table.get(s, "unknown")


def _words(text: str) -> set[str]:
    text = text.strip()
    return set() if text in ("", "(null)") else {w for w in text.split(",") if w}


def parse_slurm_nodes(text: str) -> dict[str, SlurmNode]:
    """sinfo's lines (SINFO_NODE_ARGS) -> every node, its partitions and features merged."""
    states = parse_sinfo(text)
    parts: dict[str, set[str]] = {}
    feats: dict[str, set[str]] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 6 or fields[0].strip() not in states:
            continue
        name = fields[0].strip()
        parts.setdefault(name, set()).update(p.rstrip("*") for p in _words(fields[4]))  # `*`: the default
        feats.setdefault(name, set()).update(_words(fields[5]))
    return {n: SlurmNode(n, o.base_state, frozenset(parts.get(n, ())), frozenset(feats.get(n, ())))
            for n, o in states.items()}


def pool_of(node: SlurmNode, pools: Sequence[SlurmPool]) -> SlurmPool | None:
    """The stack's pool of a Slurm node (module docstring), or None."""
    ranked = ([p for p in pools if node.name in p.node_names], [p for p in pools if p.name in node.features],
              [p for p in pools if p.name in node.partitions])
    return next((found[0] for found in ranked if found), None)


def observations_from_slurm(
    nodes: Mapping[str, SlurmNode], published: Mapping[str, str], unreadable: Mapping[str, str],
    pools: Sequence[SlurmPool], *, now: float, max_age_s: float = DEFAULT_MAX_AGE_S,
    exclusions: Mapping[str, int] | None = None,
) -> list[NodeObservation]:
    """One observation per node of the stack's pools, sorted by name. `published`: node -> the text
    of its file; `unreadable`: node -> why its file could not be read; `exclusions`: the jobs that
    excluded each node since its previous sweep."""
    out = []
    for name in sorted(nodes):
        pool = pool_of(nodes[name], pools)
        if pool is None:
            continue
        mine = {"pool": pool.name, "sku": pool.shape.sku, "expected_gpus": pool.shape.expected_gpus,
                "sched_state": sched_state_of(nodes[name].state),
                "job_exclusions": (exclusions or {}).get(name, 0)}
        obs: NodeObservation | None
        if name in published:
            obs, why = judge_published(published[name], published_file_name(name), name, now, max_age_s)
        else:
            obs, why = None, unreadable.get(name, NOT_PUBLISHED)
        if obs is None:
            out.append(NodeObservation(node=name, at=now, unknown=(why or "",), **mine))
        else:
            out.append(obs.model_copy(update=mine))
    return out


# ----------------------------------------------------------------------------- I/O


def write_published(obs: NodeObservation, directory: Path) -> Path:
    """Write the node's file whole: a temporary file in the same folder, flushed, renamed over the
    old one (a rename within one file system replaces atomically, rename(2)). Raises OSError."""
    path = directory / published_file_name(obs.node)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(obs.model_dump_json())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # the sweep may run as another user than the node's writer
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_published(directory: Path, nodes: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(node -> its file's text, node -> why its file could not be read); a missing file is in
    neither (the node published nothing). Only a regular file of at most PUBLISHED_MAX_BYTES is read:
    the folder is shared by every node, and a link, a FIFO (open(2) would wait for a writer) or a
    runaway file must cost the sweep one UNKNOWN node, not the sweep."""
    texts: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for n in nodes:
        path = directory / published_file_name(n)
        try:
            texts[n] = _read_regular(path)
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            unreadable[n] = f"{path}: {why}"
    return texts, unreadable


def _read_regular(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(PUBLISHED_MAX_BYTES + 1)
    if len(data) > PUBLISHED_MAX_BYTES:
        raise ValueError(f"larger than {PUBLISHED_MAX_BYTES} bytes")
    return data.decode()


class SlurmReadError(RuntimeError):
    pass


def _run(argv: Sequence[str]) -> str:
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S,
                             check=False)
    except FileNotFoundError:
        raise SlurmReadError(f"{argv[0]}: not found (run where Slurm's client commands are installed)"
                             ) from None
    except OSError as e:
        raise SlurmReadError(f"{argv[0]}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise SlurmReadError(f"{' '.join(argv)}: no answer within {SLURM_TIMEOUT_S:g} s") from None
    if res.returncode != 0:
        said = " ".join(res.stderr.split())[:300]
        raise SlurmReadError(f"{' '.join(argv)}: exit {res.returncode}" + (f": {said}" if said else ""))
    return res.stdout


def read_slurm_nodes() -> dict[str, SlurmNode]:
    """sinfo's nodes, as this host's Slurm commands see them. Raises SlurmReadError."""
    nodes = parse_slurm_nodes(_run(list(SINFO_NODE_ARGS)))
    if not nodes:
        raise SlurmReadError("sinfo lists no node")
    return nodes


def read_slurm_jobs() -> str:
    """`scontrol -o show job`'s text (exclusions.job_exclusions reads it). Raises SlurmReadError."""
    return _run(list(JOBS_ARGS))
