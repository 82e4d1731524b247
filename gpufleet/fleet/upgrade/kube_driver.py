"""`gpufleet upgrade run --driver gpu-operator`: the rollout's reboots done by the NVIDIA GPU
Operator's own upgrade controller, one node at a time as the rollout says (ADR 0073,
docs/fleet-upgrade.md "The GPU Operator driver").

The operator (ClusterPolicy `driver.upgradePolicy.autoUpgrade`, k8s-operator-libs pkg/upgrade)
upgrades every node whose driver pod is older than its driver DaemonSet, by itself, with no canary,
bake, gate or rollback. gpufleet keeps it to the rollout's nodes:
- Every driver node carries `nvidia.com/gpu-driver-upgrade.skip=true` (the controller leaves such
  nodes alone); a node's Reboot takes the label off that node only, and puts it back at the end.
- The rollout cordons the node before the operator sees it, so the operator records the node as
  unschedulable at the start and never uncordons it (upgrade_state.go, the initial-state
  annotation): the node returns only by the rollout's Uncordon, after gpufleet's gate.
- Reboot(node, version): the DaemonSet's image goes to `version` (its `OnDelete` pods change only
  when the controller deletes them); the controller then walks the node through cordon, pod
  deletion, drain, driver pod restart and validation to `upgrade-done`, or to `upgrade-failed` when
  the new driver pod keeps restarting. A rollback is a Reboot to the old version; a node the
  controller left `upgrade-failed` has its failing pod deleted so the DaemonSet recreates it at the
  version now in the template (the controller itself never retries a failed node).
- The controller does not watch pods: it runs on node label changes, its DaemonSets' generation and
  every 2 minutes (upgrade_controller.go plannedRequeueInterval). While a node is upgrading the
  driver writes a poll label on it each POLL_S so the controller sees each step without waiting
  the 2 minutes.
- Gate: the controller's state `upgrade-done`, the node's driver pod at the version and ready, the
  node's validator pods ready (what the operator's validation waits for), the node Ready with no
  `GpuFleetProblem` condition (gpufleet's node-health check through node-problem-detector). Then,
  on a cluster running the stack's inspect publisher (gpufleet.infra.fleet_inspect), `gpufleet
  inspect`'s checks on the node's own reading (ADR 0075): the publisher's pod on the node is
  deleted, and so recreated by its DaemonSet, because the NVIDIA runtime mounted the driver's
  libraries into the old container when it started (NVML there is the old driver's). The reading
  judged is the first one a pod other than the deleted ones wrote (the ConfigMap names its writer:
  a terminating pod may still write once), by the gate's checks (gate.py) at the light level (a
  published reading has no performance probe), the upgraded driver's version against the one
  installed. Then, with a full `gate.inspectLevel` and a performance pod (`inspect.perfPod`,
  ADR 0083), the performance floor: the pod measures the node, and its figures must reach the floor
  of the pool's reference (a SKU's published figure, else the median the same pod measured on idle
  nodes of the pool before the rollout: `measure_references`). Last, with the stack's
  `upgrade.gate.smokePod`, the smoke pod on the node (node_pod.py, ADR 0082): the site's one
  training step, which must exit 0.
- Cordon records the node first (CordonRecord) and marks it with the rollout's reason in the
  MAINTENANCE annotation; Uncordon returns only a node still carrying this run's mark.
- Hand back, at the end: the controller marks every node `upgrade-required` whose pod is older than
  the template, skipped or not, and never unmarks a skipped node. After a halted rollout (the
  template back at the old version) the nodes it did not take would read `upgrade-required` while
  they run exactly the template's version; their stale state label is removed (the controller's own
  unknown state: it computes the state again when a rollout next hands it the node).

Firmware is not the operator's to upgrade: this driver upgrades the driver only.
"""

from __future__ import annotations

import logging
import math
import statistics
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.config.gpu_operator import (
    UPGRADE_DONE,
    UPGRADE_FAILED,
    UPGRADE_REQUIRED,
    UPGRADE_SKIP_LABEL,
    UPGRADE_STATE_LABEL,
)
from gpufleet.config.placement import POOL_LABEL
from gpufleet.core.inspect_contract import (
    INSPECT_NAMESPACE,
    PUBLISHED_BY_ANNOTATION,
    PUBLISHER_APP_LABEL,
    PUBLISHER_NAMESPACE,
    configmap_name,
)
from gpufleet.core.kube_client import KubeClientError, kube_client
from gpufleet.core.maintenance import MAINTENANCE_ANNOTATION
from gpufleet.core.node_health import CONDITION
from gpufleet.fleet.inspect.cluster import PoolShape, published_observation, sched_state
from gpufleet.fleet.inspect.observation import NodeObservation as InspectObservation
from gpufleet.fleet.node_pod import NodePod, NodePodError, PodRun, perf_figures, run_on_node
from gpufleet.fleet.upgrade.gate import GateSetup, inspect_gate, perf_gate
from gpufleet.fleet.upgrade.model import Component, FleetSnapshot, Job, NodeObservation
from gpufleet.fleet.upgrade.sandbox_driver import CordonRecord, DriverError

log = logging.getLogger("gpufleet.fleet.upgrade")

OPERATOR_NAMESPACE = "gpu-operator"
DRIVER_SELECTOR = "app=nvidia-driver-daemonset"  # controllers/upgrade_controller.go DriverLabelValue
VALIDATOR_SELECTOR = "app=nvidia-operator-validator"  # cmd/gpu-operator main.go WithValidationEnabled
POLL_LABEL = "gpufleet.io/upgrade-poll"
POLL_S = 1.0
EVICT_RETRY_S = 2.0  # a refused eviction (a PodDisruptionBudget) is asked again this often
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")  # the operator's gpuPodSpecFilter prefixes
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABEL = "job-name"  # the Job controller's label on its pods
PUBLISHER_SELECTOR = "=".join(PUBLISHER_APP_LABEL)

# What the sandbox adds to the driver pod template for a version (its kwok failure annotation); a
# key mapped to None is removed.
TemplateAnnotations = Callable[[str], Mapping[str, str | None]]


# --------------------------------------------------------------------------- pure decisions


def image_version(image: str) -> str | None:
    """The tag of `repo/name:tag` (None: untagged or by digest)."""
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name and "@" not in image else None


def with_version(image: str, version: str) -> str:
    """The same image at another tag."""
    head, _, name = image.rpartition("/")
    base = name.split(":", 1)[0]
    return f"{head}/{base}:{version}" if head else f"{base}:{version}"


def pod_version(pod: Mapping[str, Any]) -> str | None:
    containers = pod.get("spec", {}).get("containers") or []
    return image_version(str(containers[0].get("image", ""))) if containers else None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    st = pod.get("status", {})
    statuses = st.get("containerStatuses") or []
    return st.get("phase") == "Running" and bool(statuses) and all(c.get("ready") for c in statuses)


def pod_restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or [])


def pod_trouble(pod: Mapping[str, Any]) -> str:
    """Why a pod is not ready, in kubelet's words (phase, waiting reason, restarts)."""
    st = pod.get("status", {})
    bits = [f"phase {st.get('phase')}"]
    for c in st.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            bits.append(f"{c.get('name')} {waiting['reason']}")
        if c.get("restartCount"):
            bits.append(f"{c['restartCount']} restarts")
    return ", ".join(bits)


def node_fault(node: Mapping[str, Any]) -> str | None:
    """What makes a node unfit: not Ready, or gpufleet's node-health condition set (None: fine)."""
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "True":
            return f"node not Ready ({c.get('reason') or c.get('status')})"
        if c.get("type") == CONDITION and c.get("status") == "True":
            return f"{CONDITION}: {c.get('message') or c.get('reason')}"
    return None


def cordoned_by(node: Mapping[str, Any], own_marks: frozenset[str] = frozenset()) -> str | None:
    """Who took the node out: None when schedulable; this or another rollout's reason; else
    someone (a person's `kubectl cordon`, remediation)."""
    if not node.get("spec", {}).get("unschedulable"):
        return None
    mark = (node["metadata"].get("annotations") or {}).get(MAINTENANCE_ANNOTATION)
    if mark is not None and mark in own_marks:
        return None
    return mark or "cordoned (spec.unschedulable) by someone else"


def uses_gpus(pod: Mapping[str, Any]) -> bool:
    for c in pod.get("spec", {}).get("containers") or []:
        res = c.get("resources") or {}
        names = [*(res.get("requests") or {}), *(res.get("limits") or {})]
        if any(n.startswith(GPU_RESOURCES) for n in names):
            return True
    return False


def gpu_jobs(pods: Sequence[Mapping[str, Any]]) -> dict[str, list[Job]]:
    """The GPU pods on each node (the rollout's jobs): id `namespace/name`, the name of the Job that
    owns it, its Kueue queue. Finished or deleted pods hold no node."""
    out: dict[str, list[Job]] = {}
    for p in pods:
        meta, node = p["metadata"], p.get("spec", {}).get("nodeName")
        phase = p.get("status", {}).get("phase")
        if not node or phase not in ("Pending", "Running") or meta.get("deletionTimestamp"):
            continue
        if not uses_gpus(p):
            continue
        labels = meta.get("labels") or {}
        out.setdefault(node, []).append(Job(id=f"{meta['namespace']}/{meta['name']}",
                                            name=labels.get(JOB_NAME_LABEL, meta["name"]),
                                            queue=labels.get(QUEUE_LABEL, "")))
    return out


def gate_verdict(node: Mapping[str, Any], driver: Mapping[str, Any] | None,
                 validators: Sequence[Mapping[str, Any]], version: str) -> tuple[bool, str]:
    """The gate after the operator's upgrade of one node (module docstring)."""
    state = (node["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL)
    if driver is None:
        return False, "no driver pod on the node"
    if state != UPGRADE_DONE:
        return False, f"operator state {state}; driver pod {pod_trouble(driver)}"
    if pod_version(driver) != version:
        return False, f"driver pod runs {pod_version(driver)}, not {version}"
    if not pod_ready(driver):
        return False, f"driver pod not ready: {pod_trouble(driver)}"
    if not validators:
        return False, "no validator pod on the node"
    bad = [v["metadata"]["name"] for v in validators if not pod_ready(v)]
    if bad:
        return False, f"validator not ready: {', '.join(bad)}"
    fault = node_fault(node)
    if fault is not None:
        return False, fault
    return True, f"operator {UPGRADE_DONE}, driver {version} ready, {len(validators)} validator(s) ready"


def reboot_outcome(node: Mapping[str, Any], driver: Mapping[str, Any] | None, version: str) -> str | None:
    """Whether the operator is through with the node at `version`: "done", "failed", or None (still
    at it). A node whose driver pod is not yet at the version is never through. `upgrade-failed` is
    the verdict on the pod at the version only while that pod itself fails (not ready, restarted:
    the controller's failure is a pod that keeps restarting). On a rollback the failed pod is
    replaced, and the controller moves the node on from `upgrade-failed` once the new pod is in sync
    and ready (ProcessUpgradeFailedNodes); until then the label still names the old pod's failure (a
    rollback read it once, e2e, and held a node whose old version was fine)."""
    if driver is None or pod_version(driver) != version or driver["metadata"].get("deletionTimestamp"):
        return None
    state = (node["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL)
    if state == UPGRADE_DONE and pod_ready(driver):
        return "done"
    if state == UPGRADE_FAILED and not pod_ready(driver) and pod_restarts(driver) > 0:
        return "failed"
    return None


def stale_required(nodes: Sequence[Mapping[str, Any]], drivers: Mapping[str, Mapping[str, Any]],
                   template_version: str | None, taken: Collection[str]) -> list[str]:
    """The nodes the rollout did not take that the controller left `upgrade-required` although
    their driver pod runs the template's version (module docstring, hand back)."""
    out = []
    for n in nodes:
        name = n["metadata"]["name"]
        state = (n["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL)
        pod = drivers.get(name)
        if (name not in taken and state == UPGRADE_REQUIRED and pod is not None
                and template_version is not None and pod_version(pod) == template_version):
            out.append(name)
    return sorted(out)


@dataclass(frozen=True)
class PerfStep:
    """The gate's performance floor (module docstring): the pod, and the gate's setup with the
    pools' references (`GpuOperatorDriver.measure_references`)."""

    pod: NodePod
    setup: GateSetup


def reference_candidates(nodes: Sequence[Mapping[str, Any]], busy: Collection[str], per_pool: int,
                         can_run: Callable[[str], bool]) -> dict[str, list[str]]:
    """pool -> up to `per_pool` nodes the performance pod may measure for the pool's reference
    (pure): Ready, schedulable, no pod holding GPUs (jobs take precedence, as in inspect's plan),
    and able to run a container; by name."""
    out: dict[str, list[str]] = {}
    for n in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(n["metadata"]["name"])
        pool = (n["metadata"].get("labels") or {}).get(POOL_LABEL)
        if pool is None or name in busy or not can_run(name) or sched_state(n, 0, 1) != "idle":
            continue
        chosen = out.setdefault(pool, [])
        if len(chosen) < per_pool:
            chosen.append(name)
    return out


def _shown(figures: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(figures.items()))


def median_figures(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One node's figures from several runs of the performance pod (pure): each metric's median over
    the runs that reported it. The median, as for a pool's reference (inspect's reference.py): a
    run slowed or sped up by a neighbour on a shared host does not move it."""
    by_metric: dict[str, list[float]] = {}
    for figures in runs:
        for metric, v in figures.items():
            by_metric.setdefault(metric, []).append(v)
    return {m: statistics.median(vs) for m, vs in sorted(by_metric.items())}


@dataclass(frozen=True)
class InspectStep:
    """The gate's inspect step (module docstring): the checks, the stack's pools, and how long a
    gate waits for the node's reading (the rollout's gateTimeoutSeconds)."""

    setup: GateSetup
    pools: Mapping[str, PoolShape]
    wait_s: float


def gate_reading(cm: Mapping[str, Any] | None, node: Mapping[str, Any], deleted: Collection[str],
                 pools: Mapping[str, PoolShape]) -> tuple[InspectObservation | None, str]:
    """The node's reading published after its publisher restarted: a ConfigMap written by a pod
    other than the `deleted` ones, with the node's pool and SKU from the stack (not from what the
    node said of itself), or None and why not (yet)."""
    name = str(node["metadata"]["name"])
    pool = (node["metadata"].get("labels") or {}).get(POOL_LABEL)
    shape = pools.get(pool or "")
    if shape is None:
        return None, f"node {name} is in no pool of the stack (label {POOL_LABEL}={pool})"
    if cm is None:
        return None, "no reading published since the publisher's restart"
    writer = (cm["metadata"].get("annotations") or {}).get(PUBLISHED_BY_ANNOTATION)
    if not writer:
        return None, f"the reading does not name its publisher pod ({PUBLISHED_BY_ANNOTATION})"
    if writer in deleted:
        return None, f"no reading published since the publisher's restart (last by {writer})"
    obs, why = published_observation(cm, name, 0.0, math.inf)  # fresh by its writer, not its clock
    if obs is None:
        return None, why or ""
    return obs.model_copy(update={"pool": pool, "sku": shape.sku, "expected_gpus": shape.expected_gpus,
                                  "sched_state": sched_state(node, 0, shape.expected_gpus)}), ""


# --------------------------------------------------------------------------- the driver


class GpuOperatorDriver:
    """Observes a Kubernetes cluster running the GPU Operator and performs the rollout's actions."""

    def __init__(self, kubeconfig: Path | None, component: Component, record_path: Path, *,
                 namespace: str = OPERATOR_NAMESPACE,
                 template_annotations: TemplateAnnotations = lambda _v: {},
                 poll_s: float = POLL_S, inspect: InspectStep | None = None,
                 smoke: NodePod | None = None, perf_pod: NodePod | None = None,
                 stage: Callable[[str], None] = lambda _v: None,
                 no_pods: Callable[[str], str | None] = lambda _n: None) -> None:
        """`stage(version)`: what the cluster needs before the driver DaemonSet names a version (the
        sandbox tags its image on its kubelet nodes). `no_pods(node)`: why a node cannot run the
        gate's pods (the sandbox's kwok nodes run no container), None when it can."""
        if component is not Component.DRIVER:
            raise DriverError("the GPU Operator upgrades the driver only; firmware needs the Slurm driver "
                              "or the vendor's tool")
        from kubernetes import client

        try:
            self.api_client = kube_client(kubeconfig)
        except KubeClientError as e:
            raise DriverError(str(e)) from None
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.namespace = namespace
        self.component = component
        self.template_annotations = template_annotations
        self.poll_s = poll_s
        self.inspect = inspect
        self.smoke = smoke
        self.perf_pod = perf_pod
        self.perf: PerfStep | None = None  # the perf pod with the references (measure_references)
        self.stage = stage
        self.no_pods = no_pods
        self.record = CordonRecord.load(record_path)
        self._polls = 0
        self._evicting: dict[str, float] = {}  # pod id -> when its eviction was last asked

    # ------------------------------------------------------------------ reading

    def _dict(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.api_client.sanitize_for_serialization(obj)
        return out

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except ApiException as e:
            raise DriverError(f"{what}: HTTP {e.status} {e.reason}: {str(e.body)[:300]}") from None

    def node(self, name: str) -> dict[str, Any]:
        return self._dict(self._call(f"read node {name}", lambda: self.core.read_node(name)))

    def _pods(self, selector: str, node: str | None = None) -> list[dict[str, Any]]:
        kw = {"label_selector": selector}
        if node is not None:
            kw["field_selector"] = f"spec.nodeName={node}"
        items = self._call(f"list pods {selector}",
                           lambda: self.core.list_namespaced_pod(self.namespace, **kw)).items
        return [self._dict(p) for p in items]

    def driver_pod(self, node: str) -> dict[str, Any] | None:
        pods = [p for p in self._pods(DRIVER_SELECTOR, node) if not p["metadata"].get("deletionTimestamp")]
        return pods[0] if pods else None

    def driver_daemonset(self) -> dict[str, Any]:
        items = self._call("list driver DaemonSets", lambda: self.apps.list_namespaced_daemon_set(
            self.namespace, label_selector=DRIVER_SELECTOR)).items
        if len(items) != 1:
            raise DriverError(f"expected one driver DaemonSet ({DRIVER_SELECTOR}) in {self.namespace}, "
                              f"found {len(items)}")
        return self._dict(items[0])

    def upgradable_nodes(self) -> list[str]:
        """The nodes running a driver pod: the fleet the operator upgrades."""
        return sorted({p["spec"]["nodeName"] for p in self._pods(DRIVER_SELECTOR)
                       if p["spec"].get("nodeName")})

    def jobs(self) -> dict[str, list[Job]]:
        pods = [self._dict(p) for p in self._call("list pods", self.core.list_pod_for_all_namespaces).items]
        out = gpu_jobs(pods)
        self._retry_evictions({j.id for js in out.values() for j in js})
        return out

    def version(self, node: str) -> str | None:
        pod = self.driver_pod(node)
        return pod_version(pod) if pod is not None else None

    def snapshot(self, own_marks: frozenset[str] = frozenset()) -> FleetSnapshot:
        """The live fleet: every driver node with its pool (label), the driver version its pod runs,
        who cordoned it, its health and its GPU pods."""
        jobs = self.jobs()
        versions = {p["spec"]["nodeName"]: pod_version(p) for p in self._pods(DRIVER_SELECTOR)
                    if p["spec"].get("nodeName")}
        # One list of the nodes, not a read per node: a snapshot of 1,250 nodes is one request.
        by_name = {n["metadata"]["name"]: n for n in (self._dict(x) for x in self._call(
            "list nodes", self.core.list_node).items)}
        nodes = []
        for name in sorted(versions):
            n = by_name.get(name) or self.node(name)
            nodes.append(NodeObservation(
                name=name, pool=(n["metadata"].get("labels") or {}).get(POOL_LABEL, "gpu"),
                version=versions[name], cordoned_by=cordoned_by(n, own_marks),
                healthy=node_fault(n) is None, jobs=jobs.get(name, [])))
        if not nodes:
            raise DriverError(f"no driver pod ({DRIVER_SELECTOR}) in namespace {self.namespace}: is the GPU "
                              "Operator deployed?")
        return FleetSnapshot(source="live", component=self.component, nodes=nodes)

    # ------------------------------------------------------------------ writing

    def _patch_node(self, node: str, body: dict[str, Any]) -> None:
        self._call(f"patch node {node}", lambda: self.core.patch_node(node, body))

    def _labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self._patch_node(node, {"metadata": {"labels": dict(labels)}})

    def hand_over(self, nodes: Sequence[str]) -> None:
        """Before the rollout: the operator leaves every driver node alone unless the rollout hands
        it one (module docstring)."""
        for n in nodes:
            self._labels(n, {UPGRADE_SKIP_LABEL: "true"})

    def hand_back(self) -> list[str]:
        """After the rollout: clear the stale `upgrade-required` of the nodes it did not take
        (module docstring); returns them."""
        template = self.driver_daemonset()["spec"]["template"]
        drivers = {p["spec"]["nodeName"]: p for p in self._pods(DRIVER_SELECTOR)
                   if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}
        nodes = [self._dict(x) for x in self._call("list nodes", self.core.list_node).items]
        stale = stale_required(nodes, drivers, pod_version({"spec": template["spec"]}), self.record.nodes)
        for name in stale:
            self._labels(name, {UPGRADE_STATE_LABEL: None})
        return stale

    def cordon(self, node: str, reason: str) -> None:
        self.record.nodes[node] = "cordoned"
        self.record.save()  # on disk before the node is cordoned
        self._patch_node(node, {"spec": {"unschedulable": True},
                                "metadata": {"annotations": {MAINTENANCE_ANNOTATION: reason}}})

    def _evict_one(self, pod_id: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        ns, name = pod_id.split("/", 1)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
        try:
            self.core.create_namespaced_pod_eviction(name, ns, body)
        except ApiException as e:
            if e.status == 404:
                return  # already gone
            # 429: a PodDisruptionBudget refuses it now; asked again while the pod is there.
            log.warning("evict %s: HTTP %s %s", pod_id, e.status, e.reason)
        self._evicting[pod_id] = time.monotonic()

    def evict(self, job_ids: tuple[str, ...]) -> None:
        for j in job_ids:
            self._evict_one(j)

    def _retry_evictions(self, present: set[str]) -> None:
        now = time.monotonic()
        for pod_id, asked in list(self._evicting.items()):
            if pod_id not in present:
                del self._evicting[pod_id]
            elif now - asked >= EVICT_RETRY_S:
                self._evict_one(pod_id)

    def uncordon(self, node: str) -> bool:
        """Make the node schedulable if it still carries this run's mark; False (left) otherwise."""
        n = self.node(node)
        mark = (n["metadata"].get("annotations") or {}).get(MAINTENANCE_ANNOTATION)
        self.record.nodes.pop(node, None)
        if mark != self.record.mark or not self.record.mark:
            log.warning("%s: mark is %r, not this rollout's: left as it is", node, mark)
            self.record.save()
            return False
        self._patch_node(node, {"spec": {"unschedulable": False},
                                "metadata": {"annotations": {MAINTENANCE_ANNOTATION: None}}})
        self.record.save()
        return True

    def hold(self, node: str, reason: str) -> None:
        self._patch_node(node, {"metadata": {"annotations": {MAINTENANCE_ANNOTATION: reason}}})
        self.record.nodes[node] = "held"
        self.record.save()

    def _set_template(self, version: str) -> None:
        ds = self.driver_daemonset()
        tmpl = ds["spec"]["template"]
        containers = tmpl["spec"]["containers"]
        want = dict(self.template_annotations(version))
        have = tmpl["metadata"].get("annotations") or {}
        if pod_version({"spec": tmpl["spec"]}) == version and all(have.get(k) == v for k, v in want.items()):
            return
        body = {"spec": {"template": {
            "metadata": {"annotations": want},
            "spec": {"containers": [{"name": c["name"], "image": with_version(c["image"], version)}
                                    for c in containers[:1]]},
        }}}
        name = ds["metadata"]["name"]
        self._call(f"patch DaemonSet {name}",
                   lambda: self.apps.patch_namespaced_daemon_set(name, self.namespace, body))

    def reboot(self, node: str, version: str, timeout_s: float) -> str | None:
        """The operator's upgrade of `node` to `version` (module docstring); the version the node's
        driver pod then runs, or None when the operator was not through within `timeout_s`."""
        try:
            self.stage(version)
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            raise DriverError(f"staging {version}: {e}") from None
        self._set_template(version)
        self._labels(node, {UPGRADE_SKIP_LABEL: None})
        end = time.monotonic() + timeout_s
        try:
            while time.monotonic() < end:
                n, pod = self.node(node), self.driver_pod(node)
                outcome = reboot_outcome(n, pod, version)
                if outcome is not None:
                    log.info("%s: operator %s at %s", node, outcome, version)
                    return version
                state = (n["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL)
                if pod is not None and state == UPGRADE_FAILED and pod_version(pod) != version:
                    # The controller never retries a failed node: its pod is recreated at the template.
                    self._delete_pod(pod["metadata"]["name"])
                self._polls += 1
                self._labels(node, {POLL_LABEL: str(self._polls)})
                time.sleep(self.poll_s)
            return None
        finally:
            self._labels(node, {UPGRADE_SKIP_LABEL: "true", POLL_LABEL: None})

    def _delete_pod(self, name: str, namespace: str | None = None) -> None:
        ns = namespace or self.namespace
        self._call(f"delete pod {ns}/{name}", lambda: self.core.delete_namespaced_pod(name, ns))

    def gate(self, node: str, version: str) -> tuple[bool, str]:
        validators = self._pods(VALIDATOR_SELECTOR, node)
        passed, detail = gate_verdict(self.node(node), self.driver_pod(node), validators, version)
        if passed and self.inspect is not None:
            passed, checked = self._inspect(node, version, self.inspect)
            detail = f"{detail}; {checked}"
        if passed and self.perf is not None:
            passed, measured = self._perf_gate(node, self.perf)
            detail = f"{detail}; {measured}"
        if passed and self.smoke is not None:
            why_not = self.no_pods(node)
            passed, ran = (True, f"no smoke pod: {why_not}") if why_not else self.smoke_pod(node)
            detail = f"{detail}; {ran}"
        return passed, detail

    # ------------------------------------------------------------------ the gate's pods

    def _run_pod(self, gp: NodePod, node: str) -> PodRun:
        """One gate pod on the node (node_pod.py), created, waited for and removed."""
        try:
            return run_on_node(self.api_client, gp, node, self.record.rollout_id or "gate", self.poll_s)
        except NodePodError as e:
            raise DriverError(str(e)) from None

    def smoke_pod(self, node: str) -> tuple[bool, str]:
        """The gate's smoke run on the node (node_pod.py), if the driver has one."""
        if self.smoke is None:
            return False, "no smoke pod configured (upgrade.gate.smokePod)"
        run = self._run_pod(self.smoke, node)
        return run.passed, run.detail

    def measure(self, gp: NodePod, node: str) -> tuple[dict[str, float], str]:
        """The performance pod's figures on the node, or ({}, why not)."""
        run = self._run_pod(gp, node)
        if not run.passed:
            return {}, run.detail
        figures, why = perf_figures(run.message)
        return figures, (run.detail if why is None else f"perf pod exit 0 but {why}")

    def _perf_gate(self, node: str, step: PerfStep) -> tuple[bool, str]:
        why_not = self.no_pods(node)
        if why_not:
            return True, f"no perf pod: {why_not}"
        figures, detail = self.measure(step.pod, node)
        if not figures:
            return False, f"performance not measured: {detail}"
        pool = (self.node(node)["metadata"].get("labels") or {}).get(POOL_LABEL, "")
        return perf_gate(figures, pool, step.setup)

    def measure_references(self, gp: NodePod, per_pool: int, runs: int = 1,
                           say: Callable[[str], None] = lambda _m: None
                           ) -> dict[str, dict[str, dict[str, float]]]:
        """Before the rollout: the performance pod `runs` times on each of up to `per_pool` idle
        nodes of each pool (reference_candidates) -> pool -> node -> the median of its runs
        (median_figures); a node with a run it could not measure is said and left out."""
        nodes = [self._dict(n) for n in self._call("list nodes", self.core.list_node).items]
        pods = [self._dict(p) for p in self._call("list pods", self.core.list_pod_for_all_namespaces).items]
        busy = {str(p["spec"].get("nodeName")) for p in pods
                if uses_gpus(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        upgradable = set(self.upgradable_nodes())
        out: dict[str, dict[str, dict[str, float]]] = {}
        for pool, names in sorted(reference_candidates(
                nodes, busy, per_pool, lambda n: n in upgradable and self.no_pods(n) is None).items()):
            for name in names:
                measured: list[dict[str, float]] = []
                for run in range(1, runs + 1):
                    figures, detail = self.measure(gp, name)
                    which = f"{pool}/{name}" + (f" run {run} of {runs}" if runs > 1 else "")
                    say(f"reference {which}: " + (_shown(figures) if figures else f"not measured: {detail}"))
                    if not figures:
                        break
                    measured.append(figures)
                else:
                    out.setdefault(pool, {})[name] = median_figures(measured)
                    if runs > 1:
                        say(f"reference {pool}/{name}: {_shown(out[pool][name])} (median of {runs} runs)")
        return out

    # ------------------------------------------------------------------ the gate's inspect step

    def has_publisher(self) -> bool:
        """Whether the cluster runs the stack's inspect publisher (a DaemonSet in its namespace)."""
        items = self._call("list inspect DaemonSets", lambda: self.apps.list_namespaced_daemon_set(
            PUBLISHER_NAMESPACE, label_selector=PUBLISHER_SELECTOR)).items
        return bool(items)

    def _publisher_pods(self, node: str) -> list[dict[str, Any]]:
        items = self._call("list inspect publisher pods", lambda: self.core.list_namespaced_pod(
            PUBLISHER_NAMESPACE, label_selector=PUBLISHER_SELECTOR, field_selector=f"spec.nodeName={node}"))
        return [self._dict(p) for p in items.items]

    def _reading(self, node: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        name = configmap_name(node)
        try:
            return self._dict(self.core.read_namespaced_config_map(name, INSPECT_NAMESPACE))
        except ApiException as e:
            if e.status == 404:
                return None
            raise DriverError(f"read ConfigMap {INSPECT_NAMESPACE}/{name}: HTTP {e.status} {e.reason}"
                              ) from None

    def _inspect(self, node: str, version: str, step: InspectStep) -> tuple[bool, str]:
        """Restart the node's publisher, wait for its first reading, judge it (module docstring)."""
        end = time.monotonic() + step.wait_s
        deleted = {str(p["metadata"]["name"]) for p in self._publisher_pods(node)}
        if not deleted:
            return False, (f"inspect: no publisher pod ({PUBLISHER_SELECTOR}) on the node in "
                           f"{PUBLISHER_NAMESPACE}")
        for name in sorted(deleted):
            self._delete_pod(name, PUBLISHER_NAMESPACE)
        why = ""
        while time.monotonic() < end:
            obs, why = gate_reading(self._reading(node), self.node(node), deleted, step.pools)
            if obs is not None:
                verdict = inspect_gate(obs, step.setup, version)
                return verdict.passed, verdict.detail
            time.sleep(self.poll_s)
        return False, f"inspect: no reading within {step.wait_s:g} s of the publisher's restart: {why}"

    def health(self, nodes: Sequence[str]) -> dict[str, str]:
        out = {}
        for name in nodes:
            fault = node_fault(self.node(name))
            if fault is not None:
                out[name] = fault
        return out
