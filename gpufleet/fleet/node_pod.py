"""A bounded pod on one Kubernetes node, judged by its end: the upgrade gate's smoke run (issue 16;
ADR 0082, docs/fleet-upgrade.md "The GPU Operator driver") and the performance pod, which measures
the node and reports its figures, in the upgrade gate and in `gpufleet inspect --kubernetes --level
full` (ADR 0083; `perf_figures`).

The stack names the pod's image and command (`upgrade.gate.smokePod`, `inspect.perfPod`): on a real
cluster, the site's training image running one step of its own job, or its bandwidth test. gpufleet
places and judges it:
- on the node itself (`spec.nodeName`: the scheduler is not asked; a node under upgrade is
  cordoned), tolerating every taint (the rollout's cordon, the GPU taint, a quarantine the gate is
  about to judge), as a DaemonSet's pods do;
- holding every GPU the node has (each resource of GPU_RESOURCE_PREFIXES at its count in the node's
  capacity), as the training job's pods do: a device plugin counts a GPU it reports Unhealthy in
  the capacity but not in the allocatable (the kubelet's device manager), so a node with an
  unhealthy GPU fails at admission (`UnexpectedAdmissionError`: "requested number of devices
  unavailable for nvidia.com/gpu. Requested: 8, Available: 7", seen on the sandbox's kubelet
  node). Asking for the allocatable count would admit it, with one GPU fewer;
- with the stack's PriorityClass if it names one: a sweep's probe on a node in service should be
  preempted by a job (a class of negative value), as the heavy checks of inspect's plan yield;
- bounded: `activeDeadlineSeconds` is the stack's deadline, and the wait for the pod's end is that
  deadline plus START_MARGIN_S for the image and the sandbox's start;
- judged by its end: Succeeded passes; Failed (an exit code, the deadline), disrupted (the
  `DisruptionTarget` condition: preempted by the scheduler, evicted) or a container that cannot
  start (an image that cannot be pulled, a bad command) fails, with the
  container's termination message (the command may write its verdict to /dev/termination-log;
  otherwise the end of its log, FallbackToLogsOnError);
- removed afterwards, whatever the verdict (gracePeriodSeconds 0: it is over).

A bundle pod (ADR 0085, gpufleet.fleet.bundle.nodepod) is placed, bounded and removed the same
way, but holds no GPU (it must run beside the job that holds them, on the node as the fault left it),
is privileged with the host's PID namespace (the kernel log; the vendor's tools), and its log is
read before it is removed: its archive comes back there.

The performance pod is placed, bounded and removed the same way. Its termination message carries
its figures: one JSON line `{"perf": {metric: value}}` (the line gpufleet's own probe,
gpufleet.fleet.inspect.collprobe, prints), metrics named as inspect names them (codes.py), each a
positive finite number. nccl-tests prints its figures to stdout only, so a site wraps it to write
that line (docs/fleet-upgrade.md "The performance pod").

`run_on_node` is the thin I/O around `run_node_pod`, with a kubernetes client.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpufleet.fleet.inspect.cluster import GPU_RESOURCE_PREFIXES
from gpufleet.fleet.inspect.codes import PERF_METRIC_CODES

GATE_APP = "gpufleet-upgrade-gate"  # the upgrade gate's pods
PROBE_APP = "gpufleet-inspect-probe"  # a sweep's performance pods
BUNDLE_APP = "gpufleet-bundle"  # a bundle's node pods
START_MARGIN_S = 60.0
POLL_S = 0.5
# Waiting reasons after which the container never starts without a change to the pod or the node.
CANNOT_START = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
MESSAGE_MAX = 400
NODE_ENV = "GPUFLEET_NODE"


@dataclass(frozen=True)
class NodePod:
    """What a node pod runs; `env` and `host_paths` are what a site (or the sandbox) adds. `role`
    names the pod, its container and its verdicts; `app` labels it (the gate's, a sweep's)."""

    image: str
    command: Sequence[str]
    deadline_s: float
    namespace: str
    image_pull_policy: str = "IfNotPresent"
    env: Mapping[str, str] = field(default_factory=dict)
    host_paths: Sequence[str] = ()  # host folders mounted read-only at the same path
    role: Literal["smoke", "perf", "bundle"] = "smoke"
    app: str = GATE_APP
    priority_class: str | None = None
    gpus: bool = True  # hold every GPU the node advertises
    privileged: bool = False  # a privileged container in the host's PID namespace


@dataclass(frozen=True)
class PodVerdict:
    done: bool
    passed: bool
    detail: str
    message: str = ""  # the container's whole termination message


@dataclass(frozen=True)
class PodRun:
    passed: bool
    detail: str
    message: str = ""
    log: str = ""  # the container's log, when asked for (read before the pod is removed)


def pod_name(node: str, run_id: str, role: str = "smoke") -> str:
    """`gpufleet-gate-<node>-<run>` (the smoke pod) or `gpufleet-perf-...`, cut to the 63 characters
    of a label value. The run is the rollout's, or a sweep's."""
    kind = "gate" if role == "smoke" else role
    return f"gpufleet-{kind}-{node}-{run_id}"[:63].rstrip("-.")


def gpu_requests(node: Mapping[str, Any]) -> dict[str, str]:
    """Every GPU resource of the node, at its count in the capacity, healthy or not (pure)."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    return {k: str(v) for k, v in sorted(capacity.items())
            if k.startswith(GPU_RESOURCE_PREFIXES) and str(v) not in ("0", "")}


def node_pod_manifest(node: Mapping[str, Any], gp: NodePod, run_id: str) -> dict[str, Any]:
    """The pod for one node (pure; module docstring)."""
    name = str(node["metadata"]["name"])
    gpus = gpu_requests(node) if gp.gpus else {}
    container: dict[str, Any] = {
        "name": gp.role,
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
    if gp.privileged:
        container["securityContext"] = {"privileged": True}
    volumes = [{"name": f"host-{i}", "hostPath": {"path": p, "type": "Directory"}}
               for i, p in enumerate(gp.host_paths)]
    if gp.host_paths:
        container["volumeMounts"] = [{"name": f"host-{i}", "mountPath": p, "readOnly": True}
                                     for i, p in enumerate(gp.host_paths)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(name, run_id, gp.role), "namespace": gp.namespace,
                     "labels": {"app": gp.app, "gpufleet.io/run": run_id,
                                "gpufleet.io/gate-pod": gp.role}},
        "spec": {
            "nodeName": name,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": max(1, int(gp.deadline_s)),
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [container],
            "volumes": volumes,
            **({"priorityClassName": gp.priority_class} if gp.priority_class else {}),
            **({"hostPID": True} if gp.privileged else {}),
        },
    }


def _message(text: object) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= MESSAGE_MAX else "..." + s[-MESSAGE_MAX:]


def pod_verdict(pod: Mapping[str, Any], role: str = "smoke") -> PodVerdict:
    """Where the gate pod stands (pure): not done yet, passed, or failed and why."""
    st = pod.get("status") or {}
    phase = st.get("phase")
    statuses = st.get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    raw = str(term.get("message") or "")
    if phase == "Succeeded":
        return PodVerdict(True, True, f"{role} pod exit 0: {_message(raw)}".rstrip(": "), raw)
    disrupted = next((c for c in st.get("conditions") or []
                      if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
    if disrupted is not None and phase != "Failed":
        # Being deleted by someone else (the scheduler preempting it for a job, an eviction, the
        # taint manager): the pod will not finish, whatever it prints while it goes.
        return PodVerdict(True, False, f"{role} pod disrupted ({disrupted.get('reason')}): "
                                       f"{_message(disrupted.get('message'))}", raw)
    if phase == "Failed":  # an exit code, the deadline, or the kubelet's refusal at admission
        if term:
            why = f"exit {term.get('exitCode')} ({term.get('reason')})"
        else:
            why = f"{st.get('reason') or 'failed'}: {_message(st.get('message'))}"
        msg = _message(raw)
        return PodVerdict(True, False, f"{role} pod {why}" + (f": {msg}" if msg else ""), raw)
    for c in statuses:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            return PodVerdict(True, False, f"{role} pod cannot start: {waiting['reason']}: "
                                           f"{_message(waiting.get('message'))}")
    return PodVerdict(False, False, f"phase {phase}")


def run_node_pod(create: Callable[[dict[str, Any]], None], read: Callable[[str], dict[str, Any] | None],
                 delete: Callable[[str], None], manifest: dict[str, Any], wait_s: float,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 read_log: Callable[[str], str] | None = None) -> PodRun:
    """Create the pod (a leftover of the same name first removed), wait for its verdict up to
    `wait_s`, read its log when `read_log` is given, remove it. The calls are the caller's (the
    driver's client)."""
    name = manifest["metadata"]["name"]
    role = str(manifest["metadata"]["labels"].get("gpufleet.io/gate-pod", "smoke"))
    delete(name)
    deadline = clock() + wait_s
    while read(name) is not None:  # the leftover's deletion goes through
        if clock() > deadline:
            return PodRun(False, f"a previous {name} is still being deleted")
        sleep(poll_s)
    started = clock()
    create(manifest)
    try:
        last = PodVerdict(False, False, "not created")
        while clock() <= deadline:
            pod = read(name)
            last = (pod_verdict(pod, role) if pod is not None
                    else PodVerdict(True, False, f"{role} pod deleted"))
            if last.done:
                took = clock() - started
                return PodRun(last.passed, f"{last.detail} in {took:.1f} s", last.message,
                              read_log(name) if read_log is not None else "")
            sleep(poll_s)
        return PodRun(False, f"{role} pod did not finish within {wait_s:.0f} s ({last.detail})")
    finally:
        delete(name)


def perf_figures(message: str) -> tuple[dict[str, float], str | None]:
    """The figures in a performance pod's termination message (pure; module docstring): the last
    line that is a JSON object with a "perf" key, or ({}, why not)."""
    for line in reversed(message.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or "perf" not in doc:
            continue
        perf = doc["perf"]
        if not isinstance(perf, dict) or not perf:
            return {}, "its perf object names no figure" + (f" ({doc['error']})" if doc.get("error") else "")
        out: dict[str, float] = {}
        for metric, value in perf.items():
            if metric not in PERF_METRIC_CODES:
                known = ", ".join(sorted(PERF_METRIC_CODES))
                return {}, f"perf.{metric}: not a metric inspect knows ({known})"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                return {}, f"perf.{metric}: {value!r} is not a positive number"
            out[metric] = float(value)
        return out, None
    return {}, 'no line {"perf": {...}} in its termination message'


class NodePodError(RuntimeError):
    """An API call of run_on_node failed (not the pod: its failure is a PodRun)."""


def run_on_node(api_client: Any, gp: NodePod, node: str, run_id: str, poll_s: float = POLL_S,
                with_log: bool = False) -> PodRun:
    """Run the pod on `node` through a kubernetes client (run_node_pod's calls); NodePodError on an
    API failure other than a pod already gone. `with_log`: the run carries the container's log."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    ns = gp.namespace

    def call(what: str, fn: Callable[[], Any], missing_ok: bool = False) -> Any:
        try:
            return fn()
        except ApiException as e:
            if missing_ok and e.status == 404:
                return None
            raise NodePodError(f"{what}: HTTP {e.status} {e.reason}: {str(e.body)[:300]}") from None

    node_obj = api_client.sanitize_for_serialization(call(f"read node {node}", lambda: core.read_node(node)))

    def read(name: str) -> dict[str, Any] | None:
        pod = call(f"read pod {ns}/{name}", lambda: core.read_namespaced_pod(name, ns), missing_ok=True)
        return None if pod is None else dict(api_client.sanitize_for_serialization(pod))

    def delete(name: str) -> None:
        call(f"delete pod {ns}/{name}", lambda: core.delete_namespaced_pod(name, ns, grace_period_seconds=0),
             missing_ok=True)

    def create(obj: dict[str, Any]) -> None:
        call(f"create pod {ns}/{obj['metadata']['name']}", lambda: core.create_namespaced_pod(ns, obj))

    def read_log(name: str) -> str:
        resp = call(f"read the log of pod {ns}/{name}", lambda: core.read_namespaced_pod_log(
            name, ns, container=gp.role, _preload_content=False), missing_ok=True)
        return "" if resp is None else bytes(resp.data).decode(errors="replace")

    return run_node_pod(create, read, delete, node_pod_manifest(node_obj, gp, run_id),
                        gp.deadline_s + START_MARGIN_S, poll_s=poll_s,
                        read_log=read_log if with_log else None)
