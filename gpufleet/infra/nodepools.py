"""GPU node pools: label and taint the nodes a stack adopts, or describe them to Karpenter.

Static pools: one server-side-apply `NodePatch` per node (the stack does not own the Node, it owns
only the fields it sets). Karpenter pools: one `NodePool` + one node class, whatever the node
count: nothing per node (Karpenter stamps the labels and taints on every node it launches).
Karpenter API: `karpenter.sh/v1` NodePool with `spec.template.spec.nodeClassRef`,
`requirements`, `taints`; AWS `karpenter.k8s.aws/v1` EC2NodeClass (Karpenter v1 docs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config import NodePool, accelerator_spec
from gpufleet.config.model import KarpenterProvisioning
from gpufleet.config.placement import node_labels, owns_nodes, pool_labels, pool_taints
from gpufleet.infra.charts import custom_resource
from gpufleet.infra.common import child

# Node class kinds -> (API group/version). AKS: Karpenter's Azure provider; GCP: its preview
# provider. Only the EC2 class carries a spec we fill in (the others take the provider defaults).
NODE_CLASS_API = {
    "EC2NodeClass": "karpenter.k8s.aws/v1",
    "AKSNodeClass": "karpenter.azure.com/v1beta1",
    "GCENodeClass": "karpenter.k8s.gcp/v1alpha1",
}


@dataclass(frozen=True)
class GpuNodePoolArgs:
    pool: NodePool
    cluster_name: str


def karpenter_node_pool_spec(pool: NodePool, prov: KarpenterProvisioning, class_name: str) -> dict[str, Any]:
    """The Karpenter NodePool spec of a pool: its instance types and capacity type as
    requirements, the pool's labels and taints on every node, and a GPU limit equal to the pool's
    declared size (Karpenter stops launching past it)."""
    group = NODE_CLASS_API[prov.node_class].split("/")[0]
    spec = accelerator_spec(pool.accelerator)
    return {
        "template": {
            "metadata": {"labels": pool_labels(pool)},
            "spec": {
                "nodeClassRef": {"group": group, "kind": prov.node_class, "name": class_name},
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": list(prov.instance_types),
                    },
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [prov.capacity_type]},
                ],
                "taints": [t.as_dict() for t in pool_taints(pool)],
            },
        },
        "limits": {spec.resource_name: str(pool.total_gpus)},
        "disruption": {
            # GPU nodes hold long jobs: consolidate only as declared, and never more than one at a time.
            "consolidationPolicy": "WhenEmpty" if prov.consolidation == "Never" else prov.consolidation,
            "consolidateAfter": "Never" if prov.consolidation == "Never" else "10m",
            "budgets": [{"nodes": "1"}],
        },
    }


def ec2_node_class_spec(pool: NodePool, prov: KarpenterProvisioning, cluster_name: str) -> dict[str, Any]:
    """EC2NodeClass: the AMI family alias, the node IAM role named as Karpenter's getting-started
    guide names it (`KarpenterNodeRole-<cluster>`), and subnets / security groups by tag."""
    selector = dict(prov.subnet_selector) or {"karpenter.sh/discovery": cluster_name}
    return {
        "amiSelectorTerms": [{"alias": f"{prov.ami_family.lower()}@latest"}],
        "role": f"KarpenterNodeRole-{cluster_name}",
        "subnetSelectorTerms": [{"tags": selector}],
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster_name}}],
        # Room for container images and checkpoints staged locally (GPU images are large).
        "blockDeviceMappings": [
            {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "500Gi", "volumeType": "gp3"}}
        ],
    }


class GpuNodePool(pulumi.ComponentResource):
    """One GPU pool of the stack."""

    node_count: pulumi.Output[int]
    gpu_count: pulumi.Output[int]

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:nodes:GpuNodePool", name, None, opts)
        pool = args.pool
        self.patches: list[k8s.core.v1.NodePatch] = []
        if owns_nodes(pool):
            node_spec = k8s.core.v1.NodeSpecPatchArgs(
                taints=[
                    k8s.core.v1.TaintPatchArgs(key=t.key, value=t.value, effect=t.effect)
                    for t in pool_taints(pool)
                ]
            )
            for index, node in enumerate(pool.node_names()):
                self.patches.append(
                    k8s.core.v1.NodePatch(
                        f"{name}-{node}",
                        metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=node_labels(pool, index)),
                        spec=node_spec,
                        opts=child(self),
                    )
                )
        else:
            prov = pool.provisioning
            assert isinstance(prov, KarpenterProvisioning)
            class_name = f"{pool.name}-gpu"
            node_class_spec = (
                ec2_node_class_spec(pool, prov, args.cluster_name)
                if (prov.node_class == "EC2NodeClass")
                else {}
            )
            self.node_class = custom_resource(
                f"{name}-class",
                NODE_CLASS_API[prov.node_class],
                prov.node_class,
                {"name": class_name},
                node_class_spec,
                child(self),
            )
            self.node_pool = custom_resource(
                f"{name}-nodepool",
                "karpenter.sh/v1",
                "NodePool",
                {"name": pool.name},
                karpenter_node_pool_spec(pool, prov, class_name),
                child(self, [self.node_class] if self.node_class is not None else []),
            )
        self.node_count = pulumi.Output.from_input(pool.total_nodes)
        self.gpu_count = pulumi.Output.from_input(pool.total_gpus)
        self.register_outputs({"nodeCount": self.node_count, "gpuCount": self.gpu_count})
