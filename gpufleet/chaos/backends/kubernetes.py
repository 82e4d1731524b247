"""The Kubernetes backend, on the official `kubernetes` client.

- isolation primitives: cordon/uncordon (a strategic-merge patch of `spec.unschedulable`), taints
  (read-modify-write of `spec.taints`: the list has no merge key, a patch replaces it), eviction
  (policy/v1 Eviction, which honours PodDisruptionBudgets, unlike a delete);
- node conditions and schedulability for the probes;
- GPU faults: a privileged pod pinned to the node (`nodeName`, hostPID) runs
  `dcgmi test --inject ...` and/or writes an `NVRM: Xid` line to the host's /dev/kmsg;
- link faults: a privileged hostNetwork pod runs `ip link set <if> down`, then up again after
  `hold_seconds` on its own, so the fault never outlives the runner.

No API server can be installed on the machines this project is tested on: the tests run this
backend against a local HTTP server that checks every request (docs/chaos.md).

The client's `patch_node` picks `application/json-patch+json` for a dict body by default (the first
JSON type in its list), which the API server rejects for an object body: every patch here names
its content type, and so does every create (see JSON below).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog.injection import (
    DcgmInject,
    InjectionModel,
    KillRank,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    NodeCrash,
    NodeHang,
    NodeReboot,
)
from gpufleet.chaos.backends.base import Backend, NodeInfo, Plan
from gpufleet.chaos.backends.slurm import dcgmi_inject_argv, kmsg_argv, kmsg_xid_line
from gpufleet.chaos.ledger import Rollback
from gpufleet.core.slurm_state import NodeObs

STRATEGIC = "application/strategic-merge-patch+json"
# kubernetes 37's generated create_* methods send no Content-Type at all and ignore _content_type
# (the API server answers 415): creates pass the header themselves.
JSON = "application/json"
SPARE_LABEL = "gpufleet.io/spare"
FAULT_LABEL = "gpufleet.io/chaos-fault"
DEFAULT_HOLD_SECONDS = 600


def connection(host: str | None, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    return {"host": host, "kubeconfig": kubeconfig, "context": context}


def core_api(conn: dict[str, Any]) -> Any:
    from kubernetes import client, config

    if conn.get("host"):
        cfg = client.Configuration()
        cfg.host = conn["host"]
        return client.CoreV1Api(client.ApiClient(cfg))
    try:
        config.load_kube_config(config_file=conn.get("kubeconfig"), context=conn.get("context"))
    except Exception:
        try:
            config.load_incluster_config()
        except Exception as e:
            raise ActivityFailed(f"no Kubernetes credentials (kubeconfig or in-cluster): {e}") from None
    return client.CoreV1Api()


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return fn(*args, **kwargs)
    except ApiException as e:
        raise ActivityFailed(f"Kubernetes {what}: {e.status} {e.reason}: {str(e.body)[:300]}") from None


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


def node_obs(node: dict[str, Any]) -> NodeObs:
    """Schedulable = not cordoned and Ready=True."""
    name = node["metadata"]["name"]
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    is_ready = bool(ready and ready.get("status") == "True")
    cordoned = bool(spec.get("unschedulable"))
    bad = [
        c["type"]
        for c in status.get("conditions") or []
        if c.get("type") != "Ready" and c.get("status") == "True"
    ]
    state = ("cordoned" if cordoned else "schedulable") + ("" if is_ready else "+notready")
    reason = ", ".join(bad)
    when = None
    if ready and ready.get("lastTransitionTime"):
        from datetime import datetime

        when = datetime.fromisoformat(str(ready["lastTransitionTime"]).replace("Z", "+00:00")).timestamp()
    return NodeObs(name, state, reason, when, is_ready and not cordoned)


# ----------------------------------------------------------------------------- rollbacks


def rb_uncordon(args: dict[str, Any]) -> None:
    api = core_api(args["conn"])
    _call("uncordon", api.patch_node, args["node"], cordon_body(False), _content_type=STRATEGIC)


def rb_untaint(args: dict[str, Any]) -> None:
    api = core_api(args["conn"])
    node = api.api_client.sanitize_for_serialization(_call("read node", api.read_node, args["node"]))
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


# ----------------------------------------------------------------------------- backend


class KubernetesBackend(Backend):
    name = "kubernetes"
    capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset({DcgmInject, LinkDown})
    not_offered: ClassVar[Mapping[type[InjectionModel], str]] = {
        NodeCrash: "needs out-of-band power control",
        NodeHang: "needs out-of-band power control",
        NodeReboot: "needs out-of-band power control",
        LinkFlap: "not implemented yet (a hostNetwork pod could run the flap loop)",
        LinkDegrade: "not implemented yet",
        KillRank: "not implemented yet (needs the job's pod for the rank)",
    }

    def __init__(
        self, conn: dict[str, Any], namespace: str, image: str, fabric_ifname: str, prometheus_url: str | None
    ) -> None:
        self.conn = conn
        self.namespace = namespace
        self.image = image
        self.fabric_ifname = fabric_ifname
        self._prom = prometheus_url
        self._api: Any = None

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = core_api(self.conn)
        return self._api

    def _nodes_raw(self) -> list[dict[str, Any]]:
        resp = _call("list nodes", self.api.list_node)
        data: list[dict[str, Any]] = self.api.api_client.sanitize_for_serialization(resp).get("items", [])
        return data

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
            raw = api.api_client.sanitize_for_serialization(_call("read node", api.read_node, node))
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

    # ------------------------------------------------------------ faults through pods
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

        return Plan(kind, target, params, rb, apply, summary, {node} if down else set())

    def plan_dcgm_inject(self, node: str, gpu: int, inj: DcgmInject) -> Plan:
        fid, value = inj.field_id, inj.value
        script = [" ".join(dcgmi_inject_argv(gpu, fid, value))]
        if inj.kmsg:
            script.append(kmsg_argv(kmsg_xid_line(int(value), f"0000:{gpu:02x}:00"), inj.burst)[2])
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

    def plan_link_down(self, node: str, inj: LinkDown) -> Plan:
        rail = inj.rail
        i = self.fabric_ifname.format(rail=rail)
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
