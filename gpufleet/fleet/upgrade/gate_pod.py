"""The Kubernetes gate's smoke run: a pod on the node under upgrade that must exit 0 before the node
returns (issue 16; ADR 0082, docs/fleet-upgrade.md "The GPU Operator driver").

The stack names the pod's image and command (`upgrade.gate.smokePod`): on a real cluster, the site's
training image running one step of its own job. gpufleet places and judges it:
- on the node itself (`spec.nodeName`: the scheduler is not asked, the node is cordoned), tolerating
  every taint (the rollout's cordon, the GPU taint, a quarantine the gate is about to judge), as a
  DaemonSet's pods do;
- holding every GPU the node advertises (each resource of GPU_RESOURCE_PREFIXES in its allocatable, at its
  full count), as the training job's pods do: a node whose device plugin lost a GPU fails the gate
  at admission;
- bounded: `activeDeadlineSeconds` is the stack's deadline, and the wait for the pod's end is that
  deadline plus START_MARGIN_S for the image and the sandbox's start;
- judged by its end: Succeeded passes; Failed (an exit code, the deadline) or a container that
  cannot start (an image that cannot be pulled, a bad command) fails, with the container's
  termination message (the command may write its verdict to /dev/termination-log; otherwise the end
  of its log, FallbackToLogsOnError);
- removed afterwards, whatever the verdict (gracePeriodSeconds 0: it is over).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet.inspect.cluster import GPU_RESOURCE_PREFIXES

GATE_APP = "gpufleet-upgrade-gate"
START_MARGIN_S = 60.0
POLL_S = 0.5
# Waiting reasons after which the container never starts without a change to the pod or the node.
CANNOT_START = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
MESSAGE_MAX = 400
NODE_ENV = "GPUFLEET_NODE"


@dataclass(frozen=True)
class GatePod:
    """What the smoke pod runs; `env` and `host_paths` are what a site (or the sandbox) adds."""

    image: str
    command: Sequence[str]
    deadline_s: float
    namespace: str
    image_pull_policy: str = "IfNotPresent"
    env: Mapping[str, str] = field(default_factory=dict)
    host_paths: Sequence[str] = ()  # host folders mounted read-only at the same path


@dataclass(frozen=True)
class PodVerdict:
    done: bool
    passed: bool
    detail: str


def pod_name(node: str, rollout_id: str) -> str:
    """`gpufleet-gate-<node>-<rollout>`, cut to the 63 characters of a label value."""
    return f"gpufleet-gate-{node}-{rollout_id}"[:63].rstrip("-.")


def gpu_requests(node: Mapping[str, Any]) -> dict[str, str]:
    """Every GPU resource the node advertises, at its full allocatable count (pure)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return {k: str(v) for k, v in sorted(alloc.items())
            if k.startswith(GPU_RESOURCE_PREFIXES) and str(v) not in ("0", "")}


def gate_pod_manifest(node: Mapping[str, Any], gp: GatePod, rollout_id: str) -> dict[str, Any]:
    """The smoke pod for one node (pure; module docstring)."""
    name = str(node["metadata"]["name"])
    gpus = gpu_requests(node)
    container: dict[str, Any] = {
        "name": "smoke",
        "image": gp.image,
        "imagePullPolicy": gp.image_pull_policy,
        "command": list(gp.command),
        # The node's name for the command (`$(GPUFLEET_NODE)` in an argument is expanded by Kubernetes).
        "env": [{"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                *({"name": k, "value": v} for k, v in sorted(gp.env.items()))],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if gpus:
        container["resources"] = {"requests": dict(gpus), "limits": dict(gpus)}
    volumes = [{"name": f"host-{i}", "hostPath": {"path": p, "type": "Directory"}}
               for i, p in enumerate(gp.host_paths)]
    if gp.host_paths:
        container["volumeMounts"] = [{"name": f"host-{i}", "mountPath": p, "readOnly": True}
                                     for i, p in enumerate(gp.host_paths)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(name, rollout_id), "namespace": gp.namespace,
                     "labels": {"app": GATE_APP, "gpufleet.io/rollout": rollout_id}},
        "spec": {
            "nodeName": name,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": max(1, int(gp.deadline_s)),
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [container],
            "volumes": volumes,
        },
    }


def _message(text: object) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= MESSAGE_MAX else "..." + s[-MESSAGE_MAX:]


def pod_verdict(pod: Mapping[str, Any]) -> PodVerdict:
    """Where the smoke pod stands (pure): not done yet, passed, or failed and why."""
    st = pod.get("status") or {}
    phase = st.get("phase")
    statuses = st.get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    if phase == "Succeeded":
        return PodVerdict(True, True, f"smoke pod exit 0: {_message(term.get('message'))}".rstrip(": "))
    if phase == "Failed":  # an exit code, the deadline, or the kubelet's refusal (OutOf<resource>)
        if term:
            why = f"exit {term.get('exitCode')} ({term.get('reason')})"
        else:
            why = f"{st.get('reason') or 'failed'}: {_message(st.get('message'))}"
        msg = _message(term.get("message"))
        return PodVerdict(True, False, f"smoke pod {why}" + (f": {msg}" if msg else ""))
    for c in statuses:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            return PodVerdict(True, False, f"smoke pod cannot start: {waiting['reason']}: "
                                           f"{_message(waiting.get('message'))}")
    return PodVerdict(False, False, f"phase {phase}")


def run_gate_pod(create: Callable[[dict[str, Any]], None], read: Callable[[str], dict[str, Any] | None],
                 delete: Callable[[str], None], manifest: dict[str, Any], wait_s: float,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    """Create the pod (a leftover of the same name first removed), wait for its verdict up to
    `wait_s`, remove it; (passed, detail). The calls are the caller's (the driver's client)."""
    name = manifest["metadata"]["name"]
    delete(name)
    deadline = clock() + wait_s
    while read(name) is not None:  # the leftover's deletion goes through
        if clock() > deadline:
            return False, f"a previous {name} is still being deleted"
        sleep(poll_s)
    started = clock()
    create(manifest)
    try:
        last = PodVerdict(False, False, "not created")
        while clock() <= deadline:
            pod = read(name)
            last = pod_verdict(pod) if pod is not None else PodVerdict(True, False, "smoke pod deleted")
            if last.done:
                return last.passed, f"{last.detail} in {clock() - started:.1f} s"
            sleep(poll_s)
        return False, f"smoke pod did not finish within {wait_s:.0f} s ({last.detail})"
    finally:
        delete(name)
