"""The Kubernetes sandbox's kwok nodes, decided from the stack (pure).

Each node is named, labelled, tainted and sized like a node of the stack's pools:
- names: the pool's own naming (`nodeNamePattern`, `nodeNames`, else `<pool>-<i>`), spares last;
- labels: gpufleet.config.placement's (the same the Pulumi program puts on real nodes: the vendor's
  feature-discovery labels incl. `nvidia.com/gpu.count`, the pool, rack and leaf group from
  `topology.nodesPerRack/nodesPerLeaf`, compute/spare role, the pool's own labels), plus what a
  kubelet and a cloud would set: `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`,
  `node.kubernetes.io/instance-type` (the pool's label, a Karpenter pool's first instance type,
  else `<accelerator>-x<gpusPerNode>`), `topology.kubernetes.io/region` and `zone` (one zone: a
  training cluster's fabric does not span zones), and KUBE_SPARE_LABEL on spares, which the chaos
  backend reads;
- taints: the pool's, plus the vendor's GPU taint when the pool declares none with that key
  (placement.pool_taints: `nvidia.com/gpu=present:NoSchedule` for NVIDIA);
- capacity = allocatable: the GPUs (`nvidia.com/gpu`, `amd.com/gpu`, `huawei.com/Ascend910`), and the
  host's CPUs and memory from HOSTS below, 110 pods (the kubelet's default maxPods).

`--nodes N` keeps the pools' proportions (largest remainder), and each pool's share of spares
(at least one spare where the pool has spares and two or more nodes).

The stack's Ceph storage nodes (`storage.ceph.storageNodes`) are made too, whatever `--nodes`, as
plain nodes: no GPU, no taint, none of the OSD selector or rack labels, which are what the Pulumi
program's node patches put on them (so `pulumi up` against the sandbox meets every node it patches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.config.accelerators import AcceleratorModel, accelerator_spec
from gpufleet.config.model import FabricKind, KarpenterProvisioning, NodePool, StackSpec, StaticProvisioning
from gpufleet.config.placement import node_labels, pool_taints
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.sandbox_contract import KUBE_SPARE_LABEL
from gpufleet.sandbox.kube.kwok_config import NODE_ANNOTATION, NODE_ANNOTATION_VALUE

MIN_NODES = 1
MAX_NODES = 5000  # what `--nodes` accepts; measured up to 1,250 (docs/kubernetes-sandbox.md)
MAX_PODS = 110  # the kubelet's default --max-pods
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
MELLANOX_NIC_LABEL = "feature.node.kubernetes.io/pci-15b3.present"  # NFD: a Mellanox/NVIDIA NIC
SANDBOX_REGION = "sandbox"


@dataclass(frozen=True)
class HostShape:
    """The host around the accelerators: logical CPUs and memory, as Kubernetes counts them."""

    cpus: int
    memory_gib: int
    source: str


# The server each accelerator usually comes in. CPU counts are logical CPUs (cores x 2 threads).
HOSTS: dict[AcceleratorModel, HostShape] = {
    AcceleratorModel.H100_SXM: HostShape(
        224, 2048, "NVIDIA DGX H100 datasheet: 2x Xeon 8480C, 112 cores, 2 TB"
    ),
    AcceleratorModel.H200_SXM: HostShape(
        224, 2048, "NVIDIA DGX H200 datasheet: 2x Xeon 8480C, 112 cores, 2 TB"
    ),
    AcceleratorModel.B200: HostShape(224, 2048, "NVIDIA DGX B200 datasheet: 2x Xeon 8570, 112 cores, 2 TB"),
    AcceleratorModel.MI300X: HostShape(
        192, 2048, "typical 8x MI300X OEM platform: 2x 48-core EPYC 9004/Xeon, 2 TB (no one datasheet)"
    ),
    AcceleratorModel.ASCEND_910B: HostShape(
        192, 1024, "Huawei Atlas 800T A2 datasheet: 4x Kunpeng 920, 48 cores each, no SMT; 1 TiB assumed"
    ),
}


# The stack says nothing about its storage servers' hardware: a two-socket server is assumed.
STORAGE_HOST = HostShape(64, 512, "assumed: the stack does not describe its storage servers")
STORAGE_POOL = ""  # KwokNode.pool of a storage node: it belongs to no GPU pool


@dataclass(frozen=True)
class PoolShare:
    """How many nodes of a pool the sandbox makes."""

    pool: NodePool
    compute: int
    spares: int

    @property
    def total(self) -> int:
        return self.compute + self.spares


def _largest_remainder(weights: Sequence[int], total: int) -> list[int]:
    whole = sum(weights)
    exact = [w * total / whole for w in weights]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


def pool_shares(spec: StackSpec, nodes: int | None) -> list[PoolShare]:
    """Nodes per pool: the stack's counts, or `nodes` spread in the pools' proportions."""
    pools = spec.node_pools
    if nodes is None:
        shares = [PoolShare(p, p.nodes, p.spares) for p in pools]
    else:
        if not MIN_NODES <= nodes <= MAX_NODES:
            raise InputError("--nodes", [Problem("nodes", f"{nodes} is outside {MIN_NODES}..{MAX_NODES}")])
        shares = []
        for pool, count in zip(pools, _largest_remainder([p.total_nodes for p in pools], nodes), strict=True):
            spares = round(count * pool.spares / pool.total_nodes)
            if pool.spares and count >= 2:
                spares = max(spares, 1)
            spares = min(spares, max(count - 1, 0))
            shares.append(PoolShare(pool, count - spares, spares))
    total = sum(s.total for s in shares)
    problems = []
    if total > MAX_NODES:
        problems.append(
            Problem(
                "nodePools", f"{total} nodes; the Kubernetes sandbox makes at most {MAX_NODES}: pass --nodes"
            )
        )
    for i, s in enumerate(shares):
        prov = s.pool.provisioning
        if (
            isinstance(prov, StaticProvisioning)
            and prov.node_names is not None
            and s.total > len(prov.node_names)
        ):
            problems.append(
                Problem(
                    f"nodePools[{i}].provisioning.nodeNames",
                    f"names {len(prov.node_names)} nodes, {s.total} needed",
                )
            )
    if problems:
        raise InputError("stack", problems)
    return shares


def scaled_pool(share: PoolShare) -> NodePool:
    """The pool with the sandbox's node and spare counts (placement reads roles from them)."""
    return share.pool.model_copy(update={"nodes": share.compute, "spares": share.spares})


def share_node_names(share: PoolShare) -> list[str]:
    """The pool's naming for `share.total` nodes, spares last."""
    pool = share.pool
    prov = pool.provisioning
    if isinstance(prov, StaticProvisioning):
        if prov.node_names is not None:
            return list(prov.node_names[: share.total])
        assert prov.node_name_pattern is not None
        return [prov.node_name_pattern.format(index=i) for i in range(share.total)]
    return [f"{pool.name}-{i}" for i in range(share.total)]


def instance_type(pool: NodePool) -> str:
    if INSTANCE_TYPE_LABEL in pool.labels:
        return pool.labels[INSTANCE_TYPE_LABEL]
    if isinstance(pool.provisioning, KarpenterProvisioning):
        return pool.provisioning.instance_types[0]
    return f"{pool.accelerator.value}-x{pool.gpus_per_node}"


def zone(spec: StackSpec) -> tuple[str, str]:
    """(region, zone) of every sandbox node: the stack's region and its zone "a"."""
    region = spec.cluster.region or SANDBOX_REGION
    return region, f"{region}-a"


def resources(pool: NodePool) -> dict[str, str]:
    host = HOSTS[pool.accelerator]
    return {
        accelerator_spec(pool.accelerator).resource_name: str(pool.gpus_per_node),
        "cpu": str(host.cpus),
        "memory": f"{host.memory_gib}Gi",
        "pods": str(MAX_PODS),
        "ephemeral-storage": "1Ti",
    }


@dataclass(frozen=True)
class KwokNode:
    name: str
    pool: str
    spare: bool
    labels: dict[str, str]
    taints: tuple[dict[str, str], ...]
    capacity: dict[str, str]

    def manifest(self) -> dict[str, Any]:
        """The Node object `up` creates: kwok's annotation, labels, taints, and a status with
        capacity and allocatable (kwok's node-initialize stage keeps them)."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": dict(self.labels),
                "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
            },
            "spec": {"taints": [dict(t) for t in self.taints]},
            "status": {"capacity": dict(self.capacity), "allocatable": dict(self.capacity)},
        }


def plan_nodes(spec: StackSpec, nodes: int | None = None) -> list[KwokNode]:
    """Every kwok node of the sandbox, pool by pool, each pool's spares last."""
    region, zone_name = zone(spec)
    nic = spec.fabric.kind in (FabricKind.INFINIBAND, FabricKind.ROCE)
    out: list[KwokNode] = []
    seen: set[str] = set()
    for share in pool_shares(spec, nodes):
        pool = scaled_pool(share)
        taints = tuple(t.as_dict() for t in pool_taints(pool))
        capacity = resources(pool)
        for index, name in enumerate(share_node_names(share)):
            if name in seen:
                raise InputError("stack", [Problem("nodePools", f"node name {name!r} is used twice")])
            seen.add(name)
            spare = index >= share.compute
            labels = {
                **node_labels(pool, index),
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                INSTANCE_TYPE_LABEL: instance_type(pool),
                REGION_LABEL: region,
                ZONE_LABEL: zone_name,
            }
            if nic:
                labels[MELLANOX_NIC_LABEL] = "true"
            if spare:
                labels[KUBE_SPARE_LABEL] = "true"
            out.append(KwokNode(name, pool.name, spare, labels, taints, capacity))
    return out


def plan_storage_nodes(spec: StackSpec) -> list[KwokNode]:
    """The stack's Ceph storage nodes (none without Ceph); a name a GPU pool also uses is refused."""
    if spec.storage.ceph is None:
        return []
    region, zone_name = zone(spec)
    gpu_nodes = {n for p in spec.node_pools for n in p.node_names()}
    out: list[KwokNode] = []
    problems = []
    for i, storage in enumerate(spec.storage.ceph.storage_nodes):
        if storage.name in gpu_nodes or any(n.name == storage.name for n in out):
            problems.append(
                Problem(f"storage.ceph.storageNodes[{i}].name", f"node name {storage.name!r} is used twice")
            )
            continue
        out.append(storage_node(storage.name, region, zone_name))
    if problems:
        raise InputError("stack", problems)
    return out


def storage_node(name: str, region: str, zone_name: str) -> KwokNode:
    """A Ceph storage node as it joins the cluster, before the Pulumi program labels it."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        INSTANCE_TYPE_LABEL: "storage",
        REGION_LABEL: region,
        ZONE_LABEL: zone_name,
    }
    capacity = {
        "cpu": str(STORAGE_HOST.cpus),
        "memory": f"{STORAGE_HOST.memory_gib}Gi",
        "pods": str(MAX_PODS),
        "ephemeral-storage": "1Ti",
    }
    return KwokNode(name, STORAGE_POOL, False, labels, (), capacity)
