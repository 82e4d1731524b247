"""The Kubernetes backend, on the official `kubernetes` client.

- isolation primitives: cordon/uncordon (a strategic-merge patch of `spec.unschedulable`), taints
  (read-modify-write of `spec.taints`: the list has no merge key, a patch replaces it), eviction
  (policy/v1 Eviction, which honours PodDisruptionBudgets, unlike a delete);
- observations: node conditions, taints and schedulability for the probes; the training Job's pods
  (Running and Ready, by completion index) for `@job:<i>` and the recovery timeline;
- faults, chosen per node from what the API says about the node (docs/adr/0036):
  - on a real node (a kubelet runs it): a privileged pod pinned to the node (`nodeName`, hostPID)
    runs `dcgmi test --inject ...` and/or writes an `NVRM: Xid` line to the host's /dev/kmsg; a
    hostNetwork pod takes a fabric link down; a node crash is `sysrq-b` from a privileged pod
    (an immediate reboot without sync, as a crash with a watchdog reset);
  - on a simulated node (kwok's annotation KWOK_NODE_ANNOTATION: no container ever runs there, so a
    fault pod could change nothing) the fault is surfaced the way the deployed platform surfaces
    it: a GPU XID or a fabric port down as node-problem-detector's condition `GpuFleetProblem`
    (patched on nodes/status with the message the generated node-health check prints, decided by
      the stack's XID policy as the check is); a node crash as a kubelet that stops: the node's Lease
    is taken over by a holder that never renews it, kwok stops renewing it (kwok renews only Leases
    it holds or that expired), and the real node lifecycle controller marks the node NotReady
    (Unknown) and taints it unreachable. (Removing kwok's annotation does not stop it: kwok v0.8
    filters node events by the annotation on the client and keeps renewing the Lease it holds.)
  - on a kubelet node of the Kubernetes sandbox (label KUBELET_NODE_LABEL; ADR 0091): its
    containers share this machine's PID namespace and kernel, so a privileged fault pod would
    act on the machine itself (sysrq-b would reboot it). A GPU fault goes through the node's agent
    (its control socket, named by the sandbox's state), whose GPUs the node's device plugin
    reports to the kubelet; every fault that needs a pod there is refused.
  Every plan records which (`params.node_kind`: real | simulated | sandbox-kubelet) in the ledger.

The client's `patch_node` picks `application/json-patch+json` for a dict body by default (the first
JSON type in its list), which the API server rejects for an object body: every patch here names
its content type, and so does every create (see JSON below). The request contracts are tested
against a local HTTP server (tests/unit/chaos/test_kubernetes_backend.py) and the whole path against
the Kubernetes sandbox's real API server (tests/e2e/test_kubernetes_gameday.py).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog.injection import (
    XID_FIELD,
    DcgmInject,
    GpuHang,
    InjectionModel,
    KillRank,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    NodeCrash,
    NodeHang,
    NodeReboot,
)
from gpufleet.chaos.backends.base import Backend, NodeInfo, Plan, TrainingPods
from gpufleet.chaos.backends.sandbox_undo import agent_request, dcgm_inject_body
from gpufleet.chaos.backends.slurm import dcgmi_inject_argv, kmsg_argv, kmsg_xid_line
from gpufleet.chaos.ledger import Rollback
from gpufleet.core import procs
from gpufleet.core.kube_client import KubeClientError, kube_client
from gpufleet.core.node_health import (
    CONDITION,
    HEALTHY_MESSAGE,
    HEALTHY_REASON,
    ISOLATING_TAINTS,
    OUT_OF_SERVICE_TAINT,
    PROBLEM_REASON,
    QUARANTINE_ANNOTATION,
    QUARANTINE_TAINT,
    fabric_problem_message,
    xid_problem_message,
)
from gpufleet.core.sandbox_contract import (
    KUBELET_NODE_LABEL,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SandboxProcess,
)
from gpufleet.core.slurm_state import NodeObs

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
# kubernetes 37's generated create_* methods send no Content-Type at all and ignore _content_type
# (the API server answers 415): creates pass the header themselves.
JSON = "application/json"
SPARE_LABEL = "gpufleet.io/spare"
FAULT_LABEL = "gpufleet.io/chaos-fault"
DEFAULT_HOLD_SECONDS = 600
NODE_LEASE_NAMESPACE = "kube-node-lease"  # one Lease per node, renewed by its kubelet (or kwok)
# Who holds a crashed simulated node's Lease: never renewed, for a day, so kwok (which renews only
# the Leases it holds or that have expired) leaves the node alone until the rollback.
CRASH_HOLDER = "gpufleet-chaos/node-crash"
CRASH_LEASE_SECONDS = 86_400
RELEASED_HOLDER = "gpufleet-chaos/released"  # the rollback: a holder whose Lease has expired
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
SIMULATED, REAL, SANDBOX_KUBELET = "simulated", "real", "sandbox-kubelet"
PCI = "0000:{gpu:02x}:00"  # the GPU's bus id in the kernel-log line, as the other backends write it


def connection(host: str | None, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    return {"host": host, "kubeconfig": kubeconfig, "context": context}


def api_client(conn: dict[str, Any]) -> Any:
    """An ApiClient for `conn` (a URL, a kubeconfig, else in-cluster), without touching the client
    library's global configuration."""
    from kubernetes import client

    if conn.get("host"):
        cfg = client.Configuration()
        cfg.host = conn["host"]
        return client.ApiClient(cfg)
    try:
        return kube_client(conn.get("kubeconfig"), conn.get("context"))
    except KubeClientError as e:
        raise ActivityFailed(f"no Kubernetes credentials (kubeconfig or in-cluster): {e}") from None


def core_api(conn: dict[str, Any]) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client(conn))


def lease_api(conn: dict[str, Any]) -> Any:
    from kubernetes import client

    return client.CoordinationV1Api(api_client(conn))


def api_error(what: str, e: Any) -> ActivityFailed:
    """An API server's refusal as an activity failure: what was tried, status, reason, body head."""
    return ActivityFailed(f"{what}: {e.status} {e.reason}: {str(e.body)[:300]}")


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return fn(*args, **kwargs)
    except ApiException as e:
        raise api_error(f"Kubernetes {what}", e) from None


def _raw(what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The call's JSON as the API server sent it (`_preload_content=False`): no typed model is built,
    which for a Job would fail on any field the client's model makes required."""
    resp = _call(what, fn, *args, _preload_content=False, **kwargs)
    out: dict[str, Any] = json.loads(resp.data)
    return out


def _plain(api: Any, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = api.api_client.sanitize_for_serialization(obj)
    return out


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------- pure bodies


def cordon_body(unschedulable: bool) -> dict[str, Any]:
    return {"spec": {"unschedulable": unschedulable}}


def taints_with(
    existing: list[dict[str, Any]], key: str, value: str | None, effect: str
) -> list[dict[str, Any]]:
    kept = [t for t in existing if not (t.get("key") == key and t.get("effect") == effect)]
    new: dict[str, Any] = {"key": key, "effect": effect}
    if value is not None:
        new["value"] = value
    return [*kept, new]


def taints_without(existing: list[dict[str, Any]], key: str, effect: str) -> list[dict[str, Any]]:
    return [t for t in existing if not (t.get("key") == key and t.get("effect") == effect)]


def sandbox_kubelet_node(node: Mapping[str, Any]) -> bool:
    """Whether the node is a kubelet node of the Kubernetes sandbox (module docstring)."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(KUBELET_NODE_LABEL) == "true"


def node_kind(node: Mapping[str, Any]) -> str:
    """SIMULATED for a node kwok runs (its annotation), else REAL: decided from the API alone."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return SIMULATED if annotations.get(KWOK_NODE_ANNOTATION) == KWOK_NODE_ANNOTATION_VALUE else REAL


def health_condition(problem: str | None, now: float) -> dict[str, Any]:
    """node-problem-detector's condition as its custom-plugin rule writes it: True with the check's
    message when it fails, False when it passes (gpufleet.infra.self_healing)."""
    return {
        "type": CONDITION,
        "status": "True" if problem else "False",
        "reason": PROBLEM_REASON if problem else HEALTHY_REASON,
        "message": problem or HEALTHY_MESSAGE,
        "lastHeartbeatTime": rfc3339(now),
        "lastTransitionTime": rfc3339(now),
    }


def condition_body(condition: Mapping[str, Any]) -> dict[str, Any]:
    """A strategic-merge patch of nodes/status: `conditions` merges by `type`, so the kubelet's
    (kwok's) conditions stay as they are."""
    return {"status": {"conditions": [dict(condition)]}}


def xid_check_message(xid: int, gpu: int, isolating: Collection[int]) -> str | None:
    """What the generated node-health check reports for a kernel log holding XID `xid` on GPU `gpu`:
    its problem message when the stack's XID policy isolates the node for it, else None (the check
    passes: a contained or ignored XID is left to the job and the alerts)."""
    return xid_problem_message(xid, PCI.format(gpu=gpu)) if xid in isolating else None


def lease_takeover_body(now: float) -> dict[str, Any]:
    """The Lease of a crashed simulated node: held by a holder that never renews it, renewed once
    now, as by a kubelet that renewed and then died. The renewal is needed: since Kubernetes 1.37
    the node lifecycle controller reads the live Lease before marking a node NotReady and waits
    while its resourceVersion differs from the one it saw last renewed
    (NodeControllerLeaseCircuitBreaker); a change without a renewal would keep the node Ready for
    ever. So the node is marked NotReady one grace period after the injection (the worst case of a
    real crash, whose last heartbeat is 0 to 10 s older)."""
    return {
        "spec": {
            "holderIdentity": CRASH_HOLDER,
            "leaseDurationSeconds": CRASH_LEASE_SECONDS,
            "renewTime": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    }


def lease_release_body() -> dict[str, Any]:
    """The rollback: the Lease expired at once, so kwok takes it over again as a new holder (a
    transition, which makes it manage the node afresh: Ready again, as a rebooted kubelet)."""
    return {"spec": {"holderIdentity": RELEASED_HOLDER, "leaseDurationSeconds": 1}}


SYSRQ_REBOOT = (
    "nsenter -t 1 -m -u -i -n -p -- sh -c 'echo 1 > /proc/sys/kernel/sysrq; echo b > /proc/sysrq-trigger'"
)


def fault_pod(
    name: str, namespace: str, node: str, image: str, command: list[str], host_network: bool, fault_id: str
) -> dict[str, Any]:
    """A privileged, run-once pod pinned to `node` (bypasses the scheduler: it must land on a node
    that may be cordoned), tolerating every taint."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {FAULT_LABEL: fault_id}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "hostPID": True,
            "hostNetwork": host_network,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "fault",
                    "image": image,
                    "command": command,
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "kmsg", "mountPath": "/dev/kmsg"}],
                }
            ],
            "volumes": [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}],
        },
    }


def _conditions(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("status") or {}).get("conditions") or [])


def node_obs(node: dict[str, Any]) -> NodeObs:
    """Schedulable = Ready=True, not cordoned, and no isolating taint (core.node_health:
    the node lifecycle controller's, out-of-service, the platform's quarantine). A problem = the
    node-health condition True, or not Ready; `problem_since` is that condition's transition time.
    `reason_time` is when the node stopped being Ready (isolation by NotReady), else None."""
    name = node["metadata"]["name"]
    spec = node.get("spec") or {}
    conds = _conditions(node)
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    is_ready = bool(ready and ready.get("status") == "True")
    cordoned = bool(spec.get("unschedulable"))
    taints = sorted(
        {
            str(t.get("key"))
            for t in spec.get("taints") or []
            if t.get("key") in ISOLATING_TAINTS and t.get("effect") != "PreferNoSchedule"
        }
    )
    health = next((c for c in conds if c.get("type") == CONDITION and c.get("status") == "True"), None)
    bad = [
        f"{c['type']}: {c.get('message') or c.get('reason') or ''}".strip(": ") if c is health else c["type"]
        for c in conds
        if c.get("type") != "Ready" and c.get("status") == "True"
    ]
    state = ("cordoned" if cordoned else "schedulable") + ("" if is_ready else "+notready")
    state += "+tainted" if taints else ""
    reason = "; ".join(bad + [f"taint {k}" for k in taints])
    not_ready_since = None if is_ready or ready is None else _parse_time(ready.get("lastTransitionTime"))
    problem_since = (
        _parse_time(health.get("lastTransitionTime")) if health is not None else not_ready_since
    )
    return NodeObs(
        name,
        state,
        reason,
        not_ready_since,
        is_ready and not cordoned and not taints,
        problem=health is not None or not is_ready,
        problem_since=problem_since,
    )


def training_pods_of(job: str, wanted: int, pods: Sequence[Mapping[str, Any]]) -> TrainingPods:
    """Running = phase Running, Ready, not being deleted (a pod on a lost node stays Running until
    the pod GC fails it, but the node lifecycle controller marks it not Ready at once)."""
    running: list[tuple[int, str]] = []
    pending = 0
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        phase = status.get("phase")
        if meta.get("deletionTimestamp"):
            continue
        if phase == "Pending":
            pending += 1
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if phase == "Running" and ready:
            index = (meta.get("annotations") or {}).get(COMPLETION_INDEX, "")
            node = str((p.get("spec") or {}).get("nodeName"))
            running.append((int(index) if index.isdigit() else 1 << 30, node))
    running.sort()
    return TrainingPods(job, wanted, len(running), pending, tuple(n for _, n in running))


# ----------------------------------------------------------------------------- rollbacks


def rb_uncordon(args: dict[str, Any]) -> None:
    api = core_api(args["conn"])
    _call("uncordon", api.patch_node, args["node"], cordon_body(False), _content_type=STRATEGIC)


def rb_untaint(args: dict[str, Any]) -> None:
    api = core_api(args["conn"])
    node = _plain(api, _call("read node", api.read_node, args["node"]))
    taints = taints_without((node.get("spec") or {}).get("taints") or [], args["key"], args["effect"])
    _call("untaint", api.patch_node, args["node"], {"spec": {"taints": taints}}, _content_type=STRATEGIC)


def rb_run_pod_and_cleanup(args: dict[str, Any]) -> None:
    """Run the undo pod (if any), then delete the fault pods by label."""
    api = core_api(args["conn"])
    ns = args["namespace"]
    if args.get("undo_pod"):
        _call(
            "create undo pod",
            api.create_namespaced_pod,
            ns,
            args["undo_pod"],
            _headers={"Content-Type": JSON},
        )
    for name in args.get("delete", []):
        from kubernetes.client.exceptions import ApiException

        try:
            api.delete_namespaced_pod(name, ns)
        except ApiException as e:
            if e.status != 404:
                raise ActivityFailed(f"delete pod {name}: {e.status} {e.reason}") from None


def rb_node_condition(args: dict[str, Any]) -> None:
    """Put the node-health condition back as it was before the fault (healthy if it had none), as
    node-problem-detector does once the check passes again (the GPU reset, the node rebooted)."""
    api = core_api(args["conn"])
    before = args.get("before")
    cond = dict(before) if before else health_condition(None, time.time())
    cond["lastHeartbeatTime"] = rfc3339(time.time())
    if cond.get("status") != "True":
        cond["lastTransitionTime"] = rfc3339(time.time())
    _call("restore node condition", api.patch_node_status, args["node"], condition_body(cond),
          _content_type=STRATEGIC)


def rb_lease_release(args: dict[str, Any]) -> None:
    """The crashed simulated node's kubelet comes back: its Lease expires, kwok takes it over."""
    leases = lease_api(args["conn"])
    _call("release node lease", leases.patch_namespaced_lease, args["node"], NODE_LEASE_NAMESPACE,
          lease_release_body(), _content_type=MERGE)


# ----------------------------------------------------------------------------- backend


class KubernetesBackend(Backend):
    name = "kubernetes"
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset({DcgmInject, LinkDown, NodeCrash})
    not_offered: ClassVar[Mapping[type[InjectionModel], str]] = {
        NodeHang: "needs out-of-band power control",
        GpuHang: "a real GPU hang cannot be caused from outside: no DCGM injection or driver "
        "interface stops a GPU's engines; it needs a kernel that spins on the device (not shipped)",
        NodeReboot: "needs out-of-band power control",
        LinkFlap: "not implemented yet (a hostNetwork pod could run the flap loop)",
        LinkDegrade: "not implemented yet",
        KillRank: "not implemented yet (needs the job's pod for the rank)",
    }

    def __init__(
        self,
        conn: dict[str, Any],
        namespace: str,
        image: str,
        fabric_ifname: str,
        prometheus_url: str | None,
        isolating_xids: Collection[int] | None = None,
        training_job: tuple[str, str] | None = None,
        daemons: Sequence[SandboxProcess] = (),
        agents: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """`isolating_xids`: the XIDs the stack's policy isolates a node for (what the node-health
        check reports; None: every XID). `training_job`: (namespace, name) of the training Job
        whose pods are the workload. `daemons`: the Kubernetes sandbox's processes, when the
        cluster is the sandbox (its state file names them), for the steady-state check.
        `agents`: the sandbox's kubelet nodes' agents, node -> (control socket, token file)."""
        self.conn = conn
        self.namespace = namespace
        self.image = image
        self.fabric_ifname = fabric_ifname
        self._prom = prometheus_url
        self.isolating_xids = None if isolating_xids is None else frozenset(isolating_xids)
        self.training_job = training_job
        self.daemons = tuple(daemons)
        self.agents = dict(agents or {})
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = api_client(self.conn)
        return self._client

    @property
    def api(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client)

    @property
    def leases(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self.client)

    @property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.client)

    def _nodes_raw(self) -> list[dict[str, Any]]:
        # Raw JSON: typed models of 1,250 nodes cost seconds per list (the watcher lists twice a second).
        data: list[dict[str, Any]] = _raw("list nodes", self.api.list_node).get("items", [])
        return data

    def _node(self, node: str) -> dict[str, Any]:
        return _plain(self.api, _call(f"read node {node}", self.api.read_node, node))

    def nodes(self) -> list[NodeInfo]:
        out = []
        for n in self._nodes_raw():
            labels = n["metadata"].get("labels") or {}
            out.append(
                NodeInfo(n["metadata"]["name"], "spare" if labels.get(SPARE_LABEL) == "true" else "compute")
            )
        return out

    def node_states(self) -> dict[str, NodeObs]:
        return {o.name: o for o in (node_obs(n) for n in self._nodes_raw())}

    def prometheus_url(self) -> str | None:
        return self._prom

    # ------------------------------------------------------------ the workload
    def training_pods(self) -> TrainingPods | None:
        if self.training_job is None:
            return None
        ns, name = self.training_job
        job = _raw(f"read job {ns}/{name}", self.batch.read_namespaced_job, name, ns)
        wanted = int((job.get("spec") or {}).get("parallelism") or 0)
        pods = _raw(f"list pods of job {ns}/{name}", self.api.list_namespaced_pod, ns,
                    label_selector=f"job-name={name}").get("items", [])
        return training_pods_of(f"{ns}/{name}", wanted, pods)

    def job_nodes(self) -> list[str]:
        pods = self.training_pods()
        return list(pods.nodes) if pods is not None else []

    def dead_daemons(self) -> list[str]:
        return [p.name for p in self.daemons if not procs.alive(p.pid, p.start_time)]

    # ------------------------------------------------------------ healing (steady.py)
    def resume_node(self, node: str) -> None:
        """Uncordon, and lift the platform's quarantine and out-of-service taints (the node lifecycle
        controller lifts its own once the node is Ready)."""
        raw = self._node(node)
        taints = [
            t for t in (raw.get("spec") or {}).get("taints") or []
            if t.get("key") not in (QUARANTINE_TAINT, OUT_OF_SERVICE_TAINT)
        ]
        body: dict[str, Any] = {"spec": {"unschedulable": False, "taints": taints}}
        if QUARANTINE_ANNOTATION in ((raw.get("metadata") or {}).get("annotations") or {}):
            body["metadata"] = {"annotations": {QUARANTINE_ANNOTATION: None}}
        _call("resume node", self.api.patch_node, node, body, _content_type=STRATEGIC)

    def resume_training(self) -> str:
        return "nothing to resubmit: the Job controller replaces the training Job's pods itself"

    # ------------------------------------------------------------ isolation primitives
    def cordon(self, node: str) -> Plan:
        api = self.api
        return Plan(
            "cordon",
            {"node": node},
            {},
            Rollback("kubernetes.uncordon", {"conn": self.conn, "node": node}),
            lambda: (_call("cordon", api.patch_node, node, cordon_body(True), _content_type=STRATEGIC), {})[
                1
            ],
            f"cordon {node} (spec.unschedulable=true)",
            {node},
        )

    def taint(self, node: str, key: str, value: str | None, effect: str) -> Plan:
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise InvalidActivity(
                f"taint effect must be NoSchedule, PreferNoSchedule or NoExecute, not {effect}"
            )
        api = self.api

        def apply() -> dict[str, Any]:
            raw = _plain(api, _call("read node", api.read_node, node))
            taints = taints_with((raw.get("spec") or {}).get("taints") or [], key, value, effect)
            _call("taint", api.patch_node, node, {"spec": {"taints": taints}}, _content_type=STRATEGIC)
            return {"taints": taints}

        return Plan(
            "taint",
            {"node": node},
            {"key": key, "value": value, "effect": effect},
            Rollback("kubernetes.untaint", {"conn": self.conn, "node": node, "key": key, "effect": effect}),
            apply,
            f"taint {node} {key}={value}:{effect}",
            {node} if effect != "PreferNoSchedule" else set(),
        )

    def evict(self, pod: str, namespace: str, grace_seconds: int | None) -> Plan:
        from kubernetes import client

        api = self.api
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=pod, namespace=namespace),
            delete_options=None
            if grace_seconds is None
            else client.V1DeleteOptions(grace_period_seconds=grace_seconds),
        )
        return Plan(
            "evict",
            {"pod": pod, "namespace": namespace},
            {"grace_seconds": grace_seconds},
            Rollback("noop", {"why": "an evicted pod is recreated by its controller"}),
            lambda: (
                _call(
                    "evict",
                    api.create_namespaced_pod_eviction,
                    pod,
                    namespace,
                    body,
                    _headers={"Content-Type": JSON},
                ),
                {},
            )[1],
            f"evict {namespace}/{pod} (policy/v1 Eviction)",
        )

    # ------------------------------------------------------------ faults through pods (real nodes)
    def _pod_plan(
        self,
        kind: str,
        node: str,
        command: list[str],
        undo: list[str] | None,
        host_network: bool,
        fault_id: str,
        target: dict[str, Any],
        params: dict[str, Any],
        summary: str,
        down: bool,
    ) -> Plan:
        if sandbox_kubelet_node(self._node(node)):
            raise InvalidActivity(
                f"node {node} is a kubelet node of the Kubernetes sandbox: its containers share this "
                f"machine's PID namespace and kernel, so the fault pod ({summary}) would act on the "
                "machine itself; only GPU faults are injected there, through the node's agent"
            )
        suffix = uuid.uuid4().hex[:6]
        name = f"gpufleet-chaos-{kind}-{suffix}"[:63]
        pod = fault_pod(name, self.namespace, node, self.image, command, host_network, fault_id)
        undo_pod = None
        if undo is not None:
            undo_pod = fault_pod(
                f"{name}-undo"[:63], self.namespace, node, self.image, undo, host_network, fault_id
            )
        rb = Rollback(
            "kubernetes.pod-undo",
            {
                "conn": self.conn,
                "namespace": self.namespace,
                "undo_pod": undo_pod,
                "delete": [name] + ([undo_pod["metadata"]["name"]] if undo_pod else []),
            },
        )
        api = self.api

        def apply() -> dict[str, Any]:
            _call(
                "create fault pod",
                api.create_namespaced_pod,
                self.namespace,
                pod,
                _headers={"Content-Type": JSON},
            )
            return {"pod": name, "created": time.time()}

        params = {**params, "node_kind": REAL}
        return Plan(kind, target, params, rb, apply, summary, {node} if down else set())

    # ------------------------------------------------------------ faults on simulated nodes
    def _condition_plan(
        self, kind: str, raw: dict[str, Any], problem: str | None, target: dict[str, Any],
        params: dict[str, Any], what: str,
    ) -> Plan:
        node = raw["metadata"]["name"]
        before = next((c for c in _conditions(raw) if c.get("type") == CONDITION), None)
        api = self.api

        def apply() -> dict[str, Any]:
            cond = health_condition(problem, time.time())
            _call("set node condition", api.patch_node_status, node, condition_body(cond),
                  _content_type=STRATEGIC)
            return {"condition": cond}

        shown = f"{CONDITION}=True ({problem})" if problem else f"{CONDITION}=False (the check passes)"
        return Plan(
            kind,
            target,
            {**params, "node_kind": SIMULATED, "surfaced_as": shown},
            Rollback("kubernetes.node-condition", {"conn": self.conn, "node": node, "before": before}),
            apply,
            f"simulated node {node}: {what} surfaced as node-problem-detector would: {shown}",
        )

    def plan_dcgm_inject(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        raw = self._node(node)
        fid, value = inj.field_id, inj.value
        if node_kind(raw) == SIMULATED:
            if fid != XID_FIELD or not inj.kmsg:
                why = f"DCGM field {fid} cannot" if fid != XID_FIELD else "an XID without it cannot"
                raise InvalidActivity(
                    f"node {node} is simulated (kwok): it has no DCGM and no kernel log, and the "
                    "platform's node-health check reads XIDs from the kernel log only, so only an XID "
                    f"with its kernel-log line can be surfaced there ({why})"
                )
            xid = int(value)
            isolating = self.isolating_xids
            message = xid_check_message(xid, gpu, isolating if isolating is not None else {xid})
            what = f"XID {xid} on GPU {gpu}"
            target = {"node": node, "gpu": gpu}
            return self._condition_plan("dcgm-inject", raw, message, target, inj.params(), what)
        if sandbox_kubelet_node(raw) and node in self.agents:
            return self._agent_plan(node, gpu, inj)
        script = [" ".join(dcgmi_inject_argv(gpu, fid, value))]
        if inj.kmsg:
            script.append(kmsg_argv(kmsg_xid_line(int(value), PCI.format(gpu=gpu)), inj.burst)[2])
        cmd = ["sh", "-c", " && ".join(script)]
        undo = dcgmi_inject_argv(gpu, fid, 0)
        return self._pod_plan(
            "dcgm-inject",
            node,
            cmd,
            undo,
            False,
            "gpu",
            {"node": node, "gpu": gpu},
            inj.params(),
            f"privileged pod on {node}: dcgmi test --inject -f {fid} -v {value}",
            False,
        )

    def _agent_plan(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        """A sandbox kubelet node's GPU fault, through its agent (the process sandbox's injection
        body); undone by clearing the GPU, a GPU reset, as on the process sandbox."""
        sock, token = self.agents[node]
        body = dcgm_inject_body(gpu, inj)
        rb = Rollback("sandbox.agent-clear", {"socket": sock, "token_file": token, "gpu": gpu, "node": node})

        def apply() -> dict[str, Any]:
            return {"agent": agent_request(sock, token, "POST", "/inject", body) or {}}

        return Plan("dcgm-inject", {"node": node, "gpu": gpu}, {**inj.params(), "node_kind": SANDBOX_KUBELET},
                    rb, apply, f"sandbox kubelet node {node}: its agent injects DCGM field {inj.field_id}="
                    f"{inj.value} on GPU {gpu}")

    def plan_link_down(self, node: str, inj: LinkDown) -> Plan:
        rail = inj.rail
        i = self.fabric_ifname.format(rail=rail)
        raw = self._node(node)
        if node_kind(raw) == SIMULATED:
            plan = self._condition_plan(
                "link-down", raw, fabric_problem_message([f"{i}/1"]),
                {"node": node, "rail": rail, "link": i}, {}, f"fabric rail {rail} ({i}) down",
            )
            plan.nodes_down = {node}
            return plan
        cmd = ["sh", "-c", f"ip link set {i} down; sleep {DEFAULT_HOLD_SECONDS}; ip link set {i} up"]
        return self._pod_plan(
            "link-down",
            node,
            cmd,
            ["ip", "link", "set", i, "up"],
            True,
            "fabric-port-down",
            {"node": node, "rail": rail, "link": i},
            {"hold_seconds": DEFAULT_HOLD_SECONDS},
            f"hostNetwork pod on {node}: ip link set {i} down",
            True,
        )

    def plan_node_crash(self, node: str) -> Plan:
        raw = self._node(node)
        if node_kind(raw) == REAL:
            return self._pod_plan(
                "node-crash",
                node,
                ["sh", "-c", SYSRQ_REBOOT],
                None,
                False,
                "node-crash",
                {"node": node},
                {"how": "sysrq-b"},
                f"privileged pod on {node}: sysrq-b (immediate reboot without sync, as a crash)",
                True,
            )
        leases = self.leases
        lease = _plain(
            self.api, _call(f"read the Lease of node {node}", leases.read_namespaced_lease, node,
                            NODE_LEASE_NAMESPACE)
        )
        spec = lease.get("spec") or {}

        def apply() -> dict[str, Any]:
            _call("take over the node's Lease", leases.patch_namespaced_lease, node, NODE_LEASE_NAMESPACE,
                  lease_takeover_body(time.time()), _content_type=MERGE)
            return {"lease_renewed_at": spec.get("renewTime")}

        return Plan(
            "node-crash",
            {"node": node},
            {"node_kind": SIMULATED, "how": "lease-takeover", "holder_before": spec.get("holderIdentity")},
            Rollback("kubernetes.lease-release", {"conn": self.conn, "node": node}),
            apply,
            f"simulated node {node}: its kubelet stops (Lease {NODE_LEASE_NAMESPACE}/{node} held by "
            f"{CRASH_HOLDER}, never renewed): the node lifecycle controller marks it NotReady",
            {node},
        )

