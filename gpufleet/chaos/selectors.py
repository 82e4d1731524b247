"""Node selectors: how an activity's `node` argument names a node. One parser for the engine (which
resolves them when a fault is applied), `gpufleet chaos validate` (which checks them before a run)
and discovery (which lists them)."""

from __future__ import annotations

import re
from dataclasses import dataclass

JOB_PREFIX = "@job:"
IDLE_PREFIX = "@idle:"
SERVING_PREFIX = "@serving:"

# A host name as Slurm's NodeName and Kubernetes' node names allow (RFC 1123 labels joined by dots,
# at most 253 characters); Slurm also accepts upper case and underscores.
_NODE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?")

# What `chaos discover gpufleet` shows under extension.node_selectors.
SELECTORS: tuple[dict[str, str], ...] = (
    {
        "syntax": f"{JOB_PREFIX}<i>",
        "example": f"{JOB_PREFIX}0",
        "meaning": "the i-th node (from 0, in the scheduler's order) the training job runs on when the "
        "activity runs; experiments use it so the fault always hits the job",
    },
    {
        "syntax": f"{IDLE_PREFIX}<i>",
        "example": f"{IDLE_PREFIX}0",
        "meaning": "the i-th schedulable node (in the scheduler's order) that runs no part of the "
        "training job: a fault there must drain it without interrupting the job",
    },
    {
        "syntax": f"{SERVING_PREFIX}<i>",
        "example": f"{SERVING_PREFIX}0",
        "meaning": "the node of the serving workload's i-th replica (from 0, in the backend's order): "
        "serving experiments hit a replica under load",
    },
    {
        "syntax": "<node name>",
        "example": "gpu-0",
        "meaning": "one node by name: a Slurm NodeName, a Kubernetes node name or a sandbox node "
        "(<pool>-<index>); letters, digits, '-', '_' and '.', at most 253 characters",
    },
)


@dataclass(frozen=True)
class JobNode:
    """`@job:<index>`: a node of the training job, resolved when the fault is applied."""

    index: int


@dataclass(frozen=True)
class IdleNode:
    """`@idle:<index>`: a schedulable node the training job does not use, resolved when applied."""

    index: int


@dataclass(frozen=True)
class ServingNode:
    """`@serving:<index>`: the node of a replica of the serving workload."""

    index: int


@dataclass(frozen=True)
class NamedNode:
    name: str


NodeSelector = JobNode | IdleNode | ServingNode | NamedNode


def parse_node_selector(text: str) -> NodeSelector:
    """Parse a node selector; ValueError says what is wrong and what is accepted."""
    kinds: tuple[tuple[str, type[JobNode] | type[IdleNode] | type[ServingNode]], ...] = (
        (JOB_PREFIX, JobNode), (IDLE_PREFIX, IdleNode), (SERVING_PREFIX, ServingNode))
    for prefix, kind in kinds:
        if text.startswith(prefix):
            index = text.removeprefix(prefix)
            if not index.isdigit() or not index.isascii():
                raise ValueError(f"bad node reference {text!r}: use {prefix}<index>, e.g. {prefix}0")
            return kind(int(index))
    if not _NODE_NAME.fullmatch(text):
        raise ValueError(
            f"bad node name {text!r}: use a node name (letters, digits, '-', '_', '.'), "
            f"{JOB_PREFIX}<index>, {IDLE_PREFIX}<index> or {SERVING_PREFIX}<index>"
        )
    return NamedNode(text)
