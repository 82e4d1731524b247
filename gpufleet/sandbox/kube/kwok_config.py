"""kwok's configuration: what its simulated kubelets do, written as data here (never taken from a
module archive).

kwok v0.8 does nothing without Stages (kwok's root command fails with "no stages found"): each
Stage selects objects with jq-like expressions and patches their status from a Go template, or
deletes them (the Stage API, kwok.x-k8s.io/v1alpha1). The sandbox's lifecycle:

Nodes
- node-initialize: a managed node whose Ready condition is not True gets kwok's node conditions
  (Ready=True and the pressure conditions False), addresses, the node info and `phase: Running`;
  capacity and allocatable are kept as the sandbox created them (GPUs, CPU, memory, pods).
- no status heartbeat: liveness is the node Lease kwok renews (`nodeLeaseDurationSeconds`, every
  quarter of it), which is what the node lifecycle controller reads, as for a kubelet whose status
  has not changed. A heartbeat Stage (a kubelet's 5 min nodeStatusReportFrequency, which the
  sandbox had) cannot be used with the chaos backend's node crash: kwok v0.8 plays a node's delayed
  Stage job even after it stopped holding the node's Lease (node_controller.go playStageWorker does
  not check readOnly): the heartbeat pending for a crashed node was seen written after the crash,
  and it posts Ready=True, which would bring the node back while it is down (docs/adr/0036).

Pods (on managed nodes only, i.e. bound by the scheduler to a kwok node)
- pod-ready: Pending -> Running, every container running and ready, an address from the pod CIDR.
- pod-terminate: a pod being deleted (or evicted) is stopped as a kubelet stops it: its containers
  end on SIGTERM (exit code 143) and the pod becomes Failed, so the Job controller sees a failed
  pod, accounts it, removes its tracking finalizer and creates the replacement.
- pod-delete: a terminated pod being deleted, with no finalizer left, is removed.
- pod-crashloop: a Pending pod annotated `gpufleet.io/driver-fails-to-load` (the GPU Operator's
  driver DaemonSet at one of the stack's `sandbox.badVersions`, gpu_operator.py) runs a container
  that is not ready and has restarted 11 times, waiting in CrashLoopBackOff: what a driver container
  that cannot load its module shows, and past the 10 restarts after which the operator's upgrade
  controller marks the node upgrade-failed (k8s-operator-libs upgrade_state.go isDriverPodFailing).
  pod-ready leaves those pods alone.
There is deliberately no "complete" stage: the training pods run until something stops them.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.core.sandbox_contract import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE

API_VERSION = "kwok.x-k8s.io/v1alpha1"
CONFIG_API_VERSION = "config.kwok.x-k8s.io/v1alpha1"
# The annotation that marks a node as kwok's (kwok's own convention, in the sandbox contract: the
# chaos backend reads it); kwok runs with --manage-nodes-with-annotation-selector on it and leaves
# every other node alone.
NODE_ANNOTATION = KWOK_NODE_ANNOTATION
NODE_ANNOTATION_VALUE = KWOK_NODE_ANNOTATION_VALUE
NODE_SELECTOR = f"{NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}"
# A kubelet's default (--node-lease-duration-seconds); a large sandbox's: daemons.liveness.
NODE_LEASE_SECONDS = 40
SIGTERM_EXIT = 143  # 128 + 15: a container that ended on the SIGTERM of a graceful deletion
# The pod annotation that makes kwok's pod-crashloop Stage fail a container (gpu_operator.py).
FAILS_TO_LOAD_ANNOTATION = "gpufleet.io/driver-fails-to-load"

_NODE_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_POD_READY = _NODE_READY

_CONDITIONS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

_NODE_INITIALIZE = (
    _CONDITIONS
    + """\
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
allocatable:
{{ YAML .status.allocatable 1 }}
capacity:
{{ YAML .status.capacity 1 }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  osImage: gpufleet-sandbox
  machineID: ""
  systemUUID: ""
  bootID: ""
phase: Running
"""
)

_POD_READY_TEMPLATE = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

def _not_ready(restarts: int, state: str, phase: str) -> str:
    """A pod status template whose every container is not ready: `state` is the containers'
    `state:` block (indented under it), `phase` and anything after it close the status."""
    return f"""\
{{{{ $now := Now }}}}
conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: Ready
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: ContainersReady
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  started: false
  restartCount: {restarts}
  state:
{state}{{{{ end }}}}
{phase}"""


# What kubelet reports for a container that keeps failing (its restart back-off: Kubernetes docs,
# "Pod Lifecycle", container restart policy), as the pod-crashloop Stage sets it at once.
CRASHLOOP_RESTARTS = 11
_POD_CRASHLOOP_TEMPLATE = _not_ready(
    CRASHLOOP_RESTARTS,
    '    waiting:\n      reason: CrashLoopBackOff\n      message: "back-off restarting failed container"\n',
    "phase: Running\nstartTime: {{ $now | Quote }}\n",
)
_POD_TERMINATE_TEMPLATE = _not_ready(
    0,
    "    terminated:\n"
    f"      exitCode: {SIGTERM_EXIT}\n"
    "      reason: Error\n"
    "      finishedAt: {{ $now | Quote }}\n",
    "phase: Failed\n",
)


def _stage(
    name: str,
    kind: str,
    selector: list[dict[str, Any]],
    nxt: dict[str, Any],
    delay_ms: tuple[int, int] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": nxt,
    }
    if delay_ms is not None:  # (least, most): kwok picks uniformly in between
        spec["delay"] = {"durationMilliseconds": delay_ms[0], "jitterDurationMilliseconds": delay_ms[1]}
    return {"apiVersion": API_VERSION, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages() -> list[dict[str, Any]]:
    """The Stage objects of the sandbox's lifecycle (module docstring), in kwok's own schema."""
    not_deleting = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    deleting = {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
    fails = f'.metadata.annotations["{FAILS_TO_LOAD_ANNOTATION}"]'
    pending = {"key": ".status.phase", "operator": "In", "values": ["Pending"]}
    return [
        _stage(
            "node-initialize",
            "Node",
            [{"key": _NODE_READY, "operator": "NotIn", "values": ["True"]}],
            {"statusTemplate": _NODE_INITIALIZE},
        ),
        _stage(
            "pod-ready",
            "Pod",
            [
                not_deleting,
                pending,
                {"key": _POD_READY, "operator": "NotIn", "values": ["True"]},
                {"key": fails, "operator": "DoesNotExist"},
            ],
            {"statusTemplate": _POD_READY_TEMPLATE},
        ),
        _stage(
            "pod-crashloop",
            "Pod",
            [not_deleting, pending, {"key": fails, "operator": "In", "values": ["true"]}],
            {"statusTemplate": _POD_CRASHLOOP_TEMPLATE},
        ),
        _stage(
            "pod-terminate",
            "Pod",
            [deleting, {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]}],
            {"statusTemplate": _POD_TERMINATE_TEMPLATE},
        ),
        _stage(
            "pod-delete",
            "Pod",
            [
                deleting,
                {"key": ".status.phase", "operator": "In", "values": ["Succeeded", "Failed"]},
                {"key": ".metadata.finalizers", "operator": "DoesNotExist"},
            ],
            {"delete": True},
        ),
    ]


def kwok_configuration(lease_s: int = NODE_LEASE_SECONDS) -> dict[str, Any]:
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "KwokConfiguration",
        "options": {
            "nodeLeaseDurationSeconds": lease_s,
            # kwok's defaults are 4 workers each; bring-up of 1,250 nodes is bound by these.
            "nodePlayStageParallelism": 16,
            "nodeLeaseParallelism": 16,
            "podPlayStageParallelism": 8,
        },
    }


def kwok_config_text(lease_s: int = NODE_LEASE_SECONDS) -> str:
    """The file given to `kwok --config`: the configuration, then every Stage."""
    return yaml.safe_dump_all([kwok_configuration(lease_s), *stages()], sort_keys=False)
