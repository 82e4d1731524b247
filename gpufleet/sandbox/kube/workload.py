"""The Kubernetes sandbox's training workload: an Indexed Job whose pods kwok runs (pure manifests).

One pod per node, each asking for every GPU of a node of the first pool (so the real scheduler
places one per node), tolerating that pool's taints and preferring compute nodes to spares; kwok
makes a scheduled pod Running (kwok_config.stages) and it runs until deleted: there is no
completion. The real Job controller replaces a pod that is deleted or evicted (kwok fails it as a
kubelet would, then removes it).

- `podFailurePolicy` ignores pods failed by a disruption (`DisruptionTarget`: an eviction, which is
  how the chaos backend drains, or a preemption), so draining never uses up `backoffLimit`; other
  failures, a deleted pod included (as a lost node would fail it), count.
- The PodDisruptionBudget allows one pod down at a time. For a Job only an integer `minAvailable`
  is allowed (Kubernetes docs, "Specifying a Disruption Budget": maxUnavailable needs a controller
  with a scale subresource).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.config.accelerators import accelerator_spec
from gpufleet.config.model import StackSpec
from gpufleet.config.placement import POOL_LABEL, pool_taints
from gpufleet.core.sandbox_contract import KUBE_SPARE_LABEL

# Where training jobs run: the namespace the Pulumi program offers Kueue's LocalQueues in
# (gpufleet.infra.scheduler.QUEUE_NAMESPACE; a unit test holds the two equal).
TRAINING_NAMESPACE = "default"
JOB_NAME = "gpufleet-training"
DEFAULT_TRAINING_NODES = 2  # a stack without a sandbox section
BACKOFF_LIMIT = 10
# kwok starts no container; the image is only what the pod spec says.
IMAGE = "ghcr.io/gpufleet/trainer:sandbox"
LABELS = {"app.kubernetes.io/name": JOB_NAME, "app.kubernetes.io/managed-by": "gpufleet-sandbox"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # the LocalQueue a Job is submitted to (Kueue's label)


@dataclass(frozen=True)
class TrainingPlan:
    replicas: int
    resource: str  # the extended resource: nvidia.com/gpu, amd.com/gpu, ...
    gpus: int  # per pod: a whole node
    pool: str


def training_plan(spec: StackSpec, compute_nodes: int) -> TrainingPlan:
    """As many pods as the stack's sandbox trains on (2 without a sandbox section), at most one per
    compute node of the first pool."""
    pool = spec.node_pools[0]
    wanted = spec.sandbox.training.nodes if spec.sandbox is not None else DEFAULT_TRAINING_NODES
    return TrainingPlan(
        replicas=max(1, min(wanted, compute_nodes)),
        resource=accelerator_spec(pool.accelerator).resource_name,
        gpus=pool.gpus_per_node,
        pool=pool.name,
    )


def training_job(
    spec: StackSpec, plan: TrainingPlan, queue: str | None = None, name: str = JOB_NAME
) -> dict[str, Any]:
    """The Job; with `queue`, submitted to that Kueue LocalQueue: labelled with it and created
    suspended, so that it starts only when Kueue admits all its pods at once (kueue.py says why the
    sandbox suspends it rather than Kueue's webhook)."""
    pool = spec.node_pools[0]
    tolerations = [t.toleration() for t in pool_taints(pool)]
    labels = {**LABELS, QUEUE_LABEL: queue} if queue is not None else dict(LABELS)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": TRAINING_NAMESPACE, "labels": labels},
        "spec": {
            **({"suspend": True} if queue is not None else {}),
            "completionMode": "Indexed",
            "parallelism": plan.replicas,
            "completions": plan.replicas,
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "restartPolicy": "Never",  # podFailurePolicy requires it
                    "automountServiceAccountToken": False,
                    "tolerations": tolerations,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": POOL_LABEL, "operator": "In", "values": [plan.pool]}
                                        ]
                                    }
                                ]
                            },
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "preference": {
                                        "matchExpressions": [
                                            {"key": KUBE_SPARE_LABEL, "operator": "DoesNotExist"}
                                        ]
                                    },
                                }
                            ],
                        }
                    },
                    "containers": [
                        {
                            "name": "trainer",
                            "image": IMAGE,
                            "resources": {
                                "requests": {plan.resource: str(plan.gpus), "cpu": "8", "memory": "64Gi"},
                                "limits": {plan.resource: str(plan.gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def training_pdb(plan: TrainingPlan) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": JOB_NAME, "namespace": TRAINING_NAMESPACE, "labels": LABELS},
        "spec": {"minAvailable": max(plan.replicas - 1, 0), "selector": {"matchLabels": LABELS}},
    }
