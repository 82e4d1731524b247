"""Safety decisions, as pure functions: blast radius and the production opt-in."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.core.taxonomy import FaultClass

# Injection methods that take their node out of service whatever the fault's class.
NODE_DOWN_METHODS = frozenset(
    {"node-crash", "node-hang", "node-reboot", "link-down", "switch-down", "nic-remove"}
)


def takes_node_down(method: str, fault_class: str | None) -> bool:
    """The method takes the node down, or the fault's class isolates its node
    (`FaultClass.isolates_node`, the one table in gpufleet.core.taxonomy). A class that may or may
    not isolate (None) does not count: a contained ECC error or a degraded link leaves the node
    schedulable."""
    if method in NODE_DOWN_METHODS:
        return True
    try:
        return fault_class is not None and FaultClass(fault_class).isolates_node is True
    except ValueError:
        return False


SHOWN_NODES = 10  # a refusal names at most this many nodes (at 1,250 nodes it would name hundreds)


def _names(nodes: Iterable[str]) -> str:
    names = sorted(nodes)
    more = len(names) - SHOWN_NODES
    return ", ".join(names[:SHOWN_NODES]) + (f" and {more} more" if more > 0 else "")


def blast_radius(
    already_down: Iterable[str],
    targets: Iterable[str],
    total_nodes: int,
    spares: int,
    max_nodes_down: int,
    allow_spare_exhaustion: bool = False,
) -> list[str]:
    """Reasons to refuse taking `targets` down; empty means allowed.

    - never more nodes down at once than the stack's `gameday.maxNodesDown`;
    - never past the last spare (more nodes down than the pool has spares) unless the experiment
      says so explicitly (`allow_spare_exhaustion`, e.g. the spare-exhaustion experiment);
    - never every node of the cluster.
    """
    down = set(already_down)
    after = down | set(targets)
    new = sorted(set(targets) - down)
    reasons = []
    if len(after) > max_nodes_down:
        reasons.append(
            f"taking {_names(new) or 'nothing new'} down would leave {len(after)} node(s) down "
            f"({_names(after)}); the stack allows gameday.maxNodesDown={max_nodes_down}"
        )
    if len(after) > spares and not allow_spare_exhaustion:
        reasons.append(
            f"{len(after)} node(s) down would exceed the {spares} spare(s): this takes the last spare; "
            "set allow_spare_exhaustion: true in the action's arguments to test spare exhaustion on purpose"
        )
    if total_nodes and len(after) >= total_nodes:
        reasons.append(f"refusing to take all {total_nodes} nodes down")
    return reasons


def production_gate(environment: str | None, allow_production: bool) -> str | None:
    """A reason to refuse, or None. Production clusters need an explicit opt-in."""
    if environment == "production" and not allow_production:
        return (
            "this stack's cluster.environment is production: set configuration "
            "gpufleet_allow_production: true to inject faults into it"
        )
    return None


def osd_blast_radius(already_down: Iterable[int], target: int, osds: int, pool_size: int,
                     pool_min_size: int) -> list[str]:
    """Reasons to refuse taking OSD `target` down; empty means allowed.

    A placement group keeps serving I/O while at least `pool_min_size` of its `pool_size` copies are
    up (Ceph "Pools": min_size). With every OSD on one host and replicas spread by OSD, any two OSDs
    may hold copies of the same PG, so at most `pool_size - pool_min_size` OSDs may be down at once
    before some PG stops; never all of them. (Ceph's own OSD thrasher keeps a max-dead limit for the
    same reason.)"""
    down = set(already_down)
    after = down | {target}
    limit = pool_size - pool_min_size
    reasons = []
    if not 0 <= target < osds:
        reasons.append(f"there is no osd.{target}: the cluster has osd.0 to osd.{osds - 1}")
    if len(after) > limit:
        names = ", ".join(f"osd.{o}" for o in sorted(after))
        reasons.append(
            f"{len(after)} OSD(s) down ({names}) with pools of size {pool_size} and min_size "
            f"{pool_min_size}: more than {limit} down stops I/O to some placement groups"
        )
    return reasons
