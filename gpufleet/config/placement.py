"""Pure decisions about GPU nodes: the labels, taints and topology a pool's nodes carry.

Label names follow the field (conventions.md, "Kubernetes GPU nodes"): the vendor labels come from
gpufleet.config.accelerators (what gpu-feature-discovery / NFD / the Ascend tooling would set), the
GPU-count label from gpu-feature-discovery, and the rack / leaf-group labels are gpufleet's own:
Volcano 1.12 reads network topology only from HyperNode objects (its label discoverer is an
unimplemented stub at v1.12.1, pkg/controllers/hypernode/discovery/label/label.go), so the program
declares the HyperNodes itself; Kueue's Topology names these labels as its levels.

Used by the Pulumi program (gpufleet.infra: labels and taints of real nodes) and by the Kubernetes
sandbox (gpufleet.sandbox.kube: the same labels and taints on its kwok nodes), so it lives with the
stack model both read.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.config.accelerators import Vendor, accelerator_spec
from gpufleet.config.gpu_operator import UPGRADE_SKIP_LABEL
from gpufleet.config.model import NodePool, SandboxProvisioning, StaticProvisioning

POOL_LABEL = "gpufleet.io/pool"
ROLE_LABEL = "gpufleet.io/role"  # compute | spare
RACK_LABEL = "gpufleet.io/rack"
LEAF_LABEL = "gpufleet.io/leaf"
TOPOLOGY_LABELS = (RACK_LABEL, LEAF_LABEL)

# The taint every GPU node of a vendor carries unless the stack declares one with that key: it
# keeps CPU-only pods off GPU nodes; GPU pods tolerate it (the GPU Operator's and Volcano's
# admission add the toleration for `nvidia.com/gpu` requests). Key = the extended resource name.
_DEFAULT_TAINT_VALUE = "present"


@dataclass(frozen=True)
class TaintSpec:
    key: str
    value: str | None
    effect: str

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        return out

    def toleration(self) -> dict[str, str]:
        """The toleration that lets a pod (an operator's DaemonSet, a game-day pod) on such a node."""
        out = {"key": self.key, "effect": self.effect, "operator": "Exists"}
        return out


def owns_nodes(pool: NodePool) -> bool:
    """Whether the stack patches named nodes of this pool (static and sandbox pools) rather than
    describing them to an autoscaler (Karpenter)."""
    return isinstance(pool.provisioning, StaticProvisioning | SandboxProvisioning)


def pool_taints(pool: NodePool) -> list[TaintSpec]:
    """The pool's declared taints, plus the vendor's GPU taint when none with that key is declared."""
    declared = [TaintSpec(t.key, t.value, t.effect.value) for t in pool.taints]
    resource = accelerator_spec(pool.accelerator).resource_name
    if all(t.key != resource for t in declared):
        declared.append(TaintSpec(resource, _DEFAULT_TAINT_VALUE, "NoSchedule"))
    return declared


def vendor_labels(pool: NodePool) -> dict[str, str]:
    """What the vendor tooling labels such a node with, set up front so that schedulers and the
    operators' node selectors match before feature discovery has run."""
    spec = accelerator_spec(pool.accelerator)
    labels = dict(spec.node_labels)
    if spec.vendor is Vendor.NVIDIA:
        labels["nvidia.com/gpu.count"] = str(pool.gpus_per_node)
        # The GPU Operator upgrades a node's driver only when a gpufleet rollout hands the node over
        # (ADR 0073): its upgrade controller leaves nodes with this label alone.
        labels[UPGRADE_SKIP_LABEL] = "true"
    return labels


def pool_labels(pool: NodePool) -> dict[str, str]:
    """Labels every node of the pool carries (vendor, pool, user labels; no per-node topology)."""
    return {**vendor_labels(pool), **pool.labels, POOL_LABEL: pool.name}


def leaf_name(pool: NodePool, index: int) -> str:
    return pool.leaf_name(index)


def topology_labels(pool: NodePool, index: int) -> dict[str, str]:
    """Placement of the pool's node number `index` (0-based, spares last): racks of
    `nodesPerRack` consecutive nodes, leaf groups (one set of leaf/ToR switches) of `nodesPerLeaf`,
    and the pool as the next tier up. A rack never straddles two leaf groups (the model checks that
    nodesPerLeaf is a multiple of nodesPerRack)."""
    t = pool.topology
    leaf = leaf_name(pool, index)
    return {
        RACK_LABEL: f"{pool.name}-rack-{index // t.nodes_per_rack:04d}",
        LEAF_LABEL: leaf,
    }


def node_labels(pool: NodePool, index: int) -> dict[str, str]:
    """All labels of one named node of the pool."""
    role = "spare" if index >= pool.nodes else "compute"
    return {**pool_labels(pool), **topology_labels(pool, index), ROLE_LABEL: role}


def leaf_groups(pool: NodePool) -> dict[str, list[str]]:
    """Node names per leaf group, in order; only for pools whose nodes are named."""
    groups: dict[str, list[str]] = {}
    for i, name in enumerate(pool.node_names()):
        groups.setdefault(leaf_name(pool, i), []).append(name)
    return groups
