"""The node pods the stack describes, as the commands run them (gpufleet.fleet.node_pod): the upgrade
gate's smoke pod (`upgrade.gate.smokePod`, ADR 0082), the performance pod (`inspect.perfPod`,
ADR 0083) and the bundle pod (`bundle.nodePod`, ADR 0085); and, on a Kubernetes sandbox with kubelet
nodes (ADR 0081), gpufleet's own programs as those pods: the one-step training run, the collective
probe and the node's bundle, in the node image with this machine's Python environment mounted
read-only."""

from __future__ import annotations

from gpufleet.config import StackSpec
from gpufleet.fleet.node_pod import BUNDLE_APP, GATE_APP, NODE_ENV, NodePod

# The sandbox's own pods: the pod's deadline, and half of it for the program's own.
SANDBOX_POD_S = 120.0
# The sandbox's probe measures a shared CPU: on this 2-core machine 8 runs on one node spread 1.645 to
# 2.048 GB/s, and one reference run read 2.52 (docs/fleet-upgrade.md). Its reference is the median
# of 3 runs, so one outlier cannot set it.
SANDBOX_REFERENCE_RUNS = 3


def smoke_pod(spec: StackSpec) -> NodePod | None:
    """The Kubernetes gate's smoke pod: the stack's `upgrade.gate.smokePod` when `smokeRun` is on."""
    gate = spec.upgrade.gate
    if not gate.smoke_run or gate.smoke_pod is None:
        return None
    sp = gate.smoke_pod
    return NodePod(image=sp.image, command=tuple(sp.command), deadline_s=sp.deadline_seconds,
                   namespace=sp.namespace or spec.gameday.namespace)


def perf_pod(spec: StackSpec, app: str = GATE_APP) -> NodePod | None:
    """The stack's performance pod (`inspect.perfPod`), labelled `app` (the gate's or a sweep's)."""
    pp = spec.inspect.perf_pod
    if pp is None:
        return None
    return NodePod(image=pp.image, command=tuple(pp.command), deadline_s=pp.deadline_seconds,
                   namespace=pp.namespace or spec.gameday.namespace, role="perf", app=app,
                   priority_class=pp.priority_class_name)


def reference_nodes(spec: StackSpec) -> int:
    """How many idle nodes per pool a rollout measures for the reference (1 for the sandbox's pod)."""
    return spec.inspect.perf_pod.reference_nodes if spec.inspect.perf_pod is not None else 1


def reference_runs(spec: StackSpec) -> int:
    """How many times the performance pod runs on each reference node (the node's figure is their
    median): the stack's `referenceRuns`, else SANDBOX_REFERENCE_RUNS for the sandbox's probe."""
    pp = spec.inspect.perf_pod
    return pp.reference_runs if pp is not None else SANDBOX_REFERENCE_RUNS


def sandbox_smoke_pod(spec: StackSpec, ranks: int) -> NodePod:
    """gpufleet's one-step training run as the smoke pod of a kubelet node."""
    from gpufleet.sandbox.kube import kubelet_node

    pool = spec.node_pools[0]
    return NodePod(image=kubelet_node.NODE_IMAGE, image_pull_policy="Never", deadline_s=SANDBOX_POD_S,
                   command=kubelet_node.smoke_command(f"$({NODE_ENV})", pool.gpus_per_node, ranks,
                                                      SANDBOX_POD_S / 2),
                   namespace=spec.gameday.namespace, env=kubelet_node.SMOKE_ENV,
                   host_paths=kubelet_node.python_env_paths())


def sandbox_perf_pod(spec: StackSpec, app: str = GATE_APP) -> NodePod:
    """gpufleet's collective probe (gloo on the CPU) as the performance pod of a kubelet node."""
    from gpufleet.sandbox.kube import kubelet_node

    return NodePod(image=kubelet_node.NODE_IMAGE, image_pull_policy="Never", deadline_s=SANDBOX_POD_S,
                   command=kubelet_node.perf_command(SANDBOX_POD_S / 2), namespace=spec.gameday.namespace,
                   env=kubelet_node.SMOKE_ENV, host_paths=kubelet_node.python_env_paths(), role="perf",
                   app=app)


def bundle_pod(spec: StackSpec) -> NodePod | None:
    """The stack's bundle pod (`bundle.nodePod`): privileged, in the host's PID namespace, no GPU."""
    bp = spec.bundle.node_pod
    if bp is None:
        return None
    return NodePod(image=bp.image, command=tuple(bp.command), deadline_s=bp.deadline_seconds,
                   namespace=bp.namespace or spec.gameday.namespace, role="bundle", app=BUNDLE_APP,
                   gpus=False, privileged=True)


# The real-node table's vendor names (gpufleet.fleet.bundle.realnode.VENDORS) by accelerator vendor.
TABLE_VENDOR = {"nvidia": "nvidia", "amd": "amd", "huawei": "ascend"}


def sandbox_bundle_pod(spec: StackSpec) -> NodePod:
    """gpufleet's own node collection (gpufleet.fleet.bundle.nodepod) as the bundle pod of a kubelet
    node: the first pool's vendor and the stack's fabric, for the Kubernetes scheduler."""
    from gpufleet.config.accelerators import accelerator_spec
    from gpufleet.sandbox.kube import kubelet_node

    vendor = TABLE_VENDOR[str(accelerator_spec(spec.node_pools[0].accelerator).vendor)]
    return NodePod(image=kubelet_node.NODE_IMAGE, image_pull_policy="Never", deadline_s=SANDBOX_POD_S,
                   command=kubelet_node.bundle_command(vendor, str(spec.fabric.kind), SANDBOX_POD_S / 2),
                   namespace=spec.gameday.namespace, env=kubelet_node.SMOKE_ENV,
                   host_paths=kubelet_node.python_env_paths(), role="bundle", app=BUNDLE_APP, gpus=False,
                   privileged=True)
