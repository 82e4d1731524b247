"""The NVIDIA GPU Operator in the Kubernetes sandbox, run for its driver upgrade controller
(docs/kubernetes-sandbox.md "The GPU Operator").

The operator (`cmd/gpu-operator`, built by kube-bins) runs as its own ServiceAccount bound to the
ClusterRole controller-gen generates from its controllers' RBAC markers. Its manifests are YAML in
its module archive, which the project does not take (ADR 0032), so its ClusterPolicy controller
deploys nothing (daemons.GPU_OPERATOR_ASSETS). In their place the sandbox declares what its
upgrade controller works on, as the operator's own would be:
- the driver DaemonSet: label `app=nvidia-driver-daemonset` (controllers/upgrade_controller.go
  DriverLabelValue), owned by the ClusterPolicy (the controller only watches DaemonSets it owns),
  `OnDelete` updates (the controller deletes each node's pod when its turn comes), on the nodes
  the operator labels `nvidia.com/gpu.deploy.driver=true`; its image tag is the driver version;
- the validator DaemonSet: label `app=nvidia-operator-validator`, the pods whose readiness the
  controller waits for before a node's upgrade is done (main.go WithValidationEnabled).
kwok runs their pods. A driver version in the stack's `sandbox.badVersions` gets the pod template
annotation FAILS_TO_LOAD, which kwok's `pod-crashloop` Stage turns into a container that keeps
restarting (kwok_config.py): the controller then marks the node `upgrade-failed`.

On a kubelet node (kubelet_node.py) the same pods run real containers of the node image, tagged
with the DaemonSets' image names (image_tags; a rollout's new version is tagged when the rollout
sets it): the driver container exits 1 when its pod carries FAILS_TO_LOAD (read through the
downward API) and otherwise runs until stopped, as a driver container that loaded its module does;
the validator runs until stopped.
"""

from __future__ import annotations

from typing import Any

from gpufleet.config import StackSpec, Vendor, accelerator_spec
from gpufleet.config.gpu_operator import driver_upgrade_policy, pinned_driver
from gpufleet.sandbox.kube.kwok_config import FAILS_TO_LOAD_ANNOTATION
from gpufleet.sandbox.kube.rbac import MANAGED, namespace, role_ref

NAMESPACE = "gpu-operator"
SERVICE_ACCOUNT = "gpu-operator"
CRD_SOURCE = "gpu-operator"  # tools/kube/versions.toml [crds.gpu-operator]: its CRDs and ClusterRole
CLUSTER_POLICY = "cluster-policy"  # the name the operator's chart gives it
DRIVER_DAEMONSET = "nvidia-driver-daemonset"
DRIVER_APP = "nvidia-driver-daemonset"
DRIVER_CONTAINER = "nvidia-driver-ctr"
DRIVER_IMAGE = "nvcr.io/nvidia/driver"
VALIDATOR_DAEMONSET = "nvidia-operator-validator"
VALIDATOR_APP = "nvidia-operator-validator"
DEPLOY_DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"  # the operator's labelGPUNodes sets it "true"
FAILS_TO_LOAD = FAILS_TO_LOAD_ANNOTATION


def nvidia_pools(spec: StackSpec) -> list[str]:
    return [p.name for p in spec.node_pools if accelerator_spec(p.accelerator).vendor is Vendor.NVIDIA]


def identity_objects(cluster_role: dict[str, Any]) -> list[dict[str, Any]]:
    """The operator's namespace (privileged: its DaemonSets are), ServiceAccount, the generated
    ClusterRole and its binding."""
    name = cluster_role["metadata"]["name"]
    role = {**cluster_role, "metadata": {"name": name, "labels": MANAGED}}
    return [
        namespace(NAMESPACE, privileged=True),
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": MANAGED},
         "automountServiceAccountToken": False},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name, "labels": MANAGED}, "roleRef": role_ref("ClusterRole", name),
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
    ]


def cluster_policy(spec: StackSpec, gpu_nodes: int) -> dict[str, Any]:
    """The ClusterPolicy: the driver with the stack's upgrade policy, every other operand off (kwok
    nodes run none of them). The sections the CRD requires are all present."""
    off = {"enabled": False}
    return {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": CLUSTER_POLICY, "labels": MANAGED},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "daemonsets": {"tolerations": [{"operator": "Exists"}]},
            "driver": {"enabled": True, "version": pinned_driver(spec),
                       "upgradePolicy": driver_upgrade_policy(spec.upgrade, gpu_nodes)},
            "toolkit": off, "devicePlugin": off, "dcgm": off, "dcgmExporter": off, "gfd": off,
            "nodeStatusExporter": off,
        },
    }


def _owner(policy_uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": CLUSTER_POLICY,
             "uid": policy_uid, "controller": True, "blockOwnerDeletion": True}]


VALIDATOR_IMAGE = "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.4"
FAILS_ENV = "GPUFLEET_FAILS_TO_LOAD"
# What the containers do on a kubelet node (kwok ignores commands). They end at SIGTERM: a PID 1
# without a handler ignores it, and the kubelet then waits the pod's 30 s grace period to kill it
# (seen here: the operator's upgrade of a kubelet node took 32.7 s, against 2 s on kwok).
_UNTIL_STOPPED = "trap 'exit 0' TERM; sleep infinity & wait"
DRIVER_LOADED = "/tmp/driver-loaded"
DRIVER_COMMAND = ["/bin/sh", "-c", f'if [ "${FAILS_ENV}" = true ]; then '
                  'echo "sandbox driver: the kernel module failed to load" >&2; exit 1; fi; '
                  f"touch {DRIVER_LOADED}; " + _UNTIL_STOPPED]
# Ready once the module is loaded, as the operator's driver container's startup probe says (it runs
# nvidia-smi); without a probe a container is ready while running, and a failing one ran for an
# instant: the operator once passed a bad version's pod on a kubelet node in that instant.
DRIVER_READINESS = {"exec": {"command": ["test", "-f", DRIVER_LOADED]}, "periodSeconds": 1}
VALIDATOR_COMMAND = ["/bin/sh", "-c", _UNTIL_STOPPED]


def image_tags(spec: StackSpec) -> list[str]:
    """The images a kubelet node needs for the DaemonSets at bring-up: the pinned driver's and the
    validator's."""
    return [f"{DRIVER_IMAGE}:{pinned_driver(spec)}", VALIDATOR_IMAGE]


def _daemonset(name: str, app: str, container: str, image: str, policy_uid: str, strategy: str,
               annotations: dict[str, str], command: list[str], extra: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    labels = {"app": app, **MANAGED}
    spec: dict[str, Any] = {"name": container, "image": image, "command": command, **(extra or {})}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                     "ownerReferences": _owner(policy_uid)},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "updateStrategy": {"type": strategy},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "nodeSelector": {DEPLOY_DRIVER_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "automountServiceAccountToken": False,
                    "containers": [spec],
                },
            },
        },
    }


def driver_daemonset(version: str, policy_uid: str, fails_to_load: bool) -> dict[str, Any]:
    # The bad-version annotation reaches the container through the downward API.
    field = {"fieldPath": f"metadata.annotations['{FAILS_TO_LOAD}']"}
    env = [{"name": FAILS_ENV, "valueFrom": {"fieldRef": field}}]
    return _daemonset(DRIVER_DAEMONSET, DRIVER_APP, DRIVER_CONTAINER, f"{DRIVER_IMAGE}:{version}", policy_uid,
                      "OnDelete", {FAILS_TO_LOAD: "true"} if fails_to_load else {}, DRIVER_COMMAND,
                      {"env": env, "readinessProbe": DRIVER_READINESS})


def validator_daemonset(policy_uid: str) -> dict[str, Any]:
    return _daemonset(VALIDATOR_DAEMONSET, VALIDATOR_APP, "nvidia-operator-validator", VALIDATOR_IMAGE,
                      policy_uid, "RollingUpdate", {}, VALIDATOR_COMMAND)


def driver_version(pod: dict[str, Any]) -> str | None:
    """The driver version a driver pod runs: its image tag."""
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == DRIVER_CONTAINER and ":" in c.get("image", ""):
            return str(c["image"]).rsplit(":", 1)[1]
    return None
