"""The GPU Operator driver's decisions (pure), on objects in the API server's JSON form: versions
from image tags, when the operator is through with a node, the gate, the jobs holding a node, and
who cordoned it."""

from __future__ import annotations

from typing import Any

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config import AcceleratorModel
from gpufleet.config.gpu_operator import UPGRADE_STATE_LABEL
from gpufleet.config.placement import POOL_LABEL
from gpufleet.core.inspect_contract import INSPECT_NAMESPACE
from gpufleet.core.node_health import CONDITION
from gpufleet.fleet.inspect.checks import Pins
from gpufleet.fleet.inspect.cluster import PoolShape, publish_body
from gpufleet.fleet.inspect.observation import GpuObs, PortObs
from gpufleet.fleet.inspect.observation import NodeObservation as InspectObservation
from gpufleet.fleet.inspect.thresholds import load_thresholds
from gpufleet.fleet.upgrade.gate import GateSetup, inspect_gate
from gpufleet.fleet.upgrade.kube_driver import (
    MAINTENANCE_ANNOTATION,
    cordoned_by,
    gate_reading,
    gate_verdict,
    gpu_jobs,
    image_version,
    median_figures,
    node_fault,
    reboot_outcome,
    reference_candidates,
    stale_required,
    with_version,
)
from gpufleet.fleet.upgrade.model import Component, Job


def node(state: str | None = "upgrade-done", unschedulable: bool = False, mark: str | None = None,
         conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": {UPGRADE_STATE_LABEL: state} if state else {},
                         "annotations": {MAINTENANCE_ANNOTATION: mark} if mark else {}},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": conditions or [{"type": "Ready", "status": "True"}]}}


def pod(version: str, ready: bool = True, restarts: int = 0, waiting: str | None = None,
        name: str = "nvidia-driver-daemonset-x") -> dict[str, Any]:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "nvidia-driver-ctr",
                                     "image": f"nvcr.io/nvidia/driver:{version}"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "nvidia-driver-ctr", "ready": ready, "restartCount": restarts, "state": state}]}}


def test_versions_are_image_tags() -> None:
    assert image_version("nvcr.io/nvidia/driver:570.124.06") == "570.124.06"
    assert image_version("localhost:5000/driver") is None  # a registry port is not a tag
    assert image_version("nvcr.io/nvidia/driver@sha256:abc") is None
    assert with_version("localhost:5000/nvidia/driver:550.90.07", "570.124.06") == \
        "localhost:5000/nvidia/driver:570.124.06"
    assert with_version("driver", "1") == "driver:1"


def test_the_operator_is_through_only_at_the_version() -> None:
    # Not yet restarted: the old pod on a node still labelled done from before.
    assert reboot_outcome(node("upgrade-done"), pod("550.90.07"), "570.124.06") is None
    assert reboot_outcome(node("pod-restart-required"), pod("570.124.06"), "570.124.06") is None
    assert reboot_outcome(node("upgrade-done"), pod("570.124.06"), "570.124.06") == "done"
    assert reboot_outcome(node("upgrade-done"), pod("570.124.06", ready=False), "570.124.06") is None
    bad = pod("560.0.0-bad", ready=False, restarts=11, waiting="CrashLoopBackOff")
    assert reboot_outcome(node("upgrade-failed"), bad, "560.0.0-bad") == "failed"
    # A rollback's new pod, ready at the old version, while the label still names the bad pod's failure:
    # the controller moves the node on from upgrade-failed; not a verdict on this pod.
    assert reboot_outcome(node("upgrade-failed"), pod("550.90.07"), "550.90.07") is None
    starting = pod("550.90.07", ready=False)
    assert reboot_outcome(node("upgrade-failed"), starting, "550.90.07") is None
    assert reboot_outcome(node("upgrade-done"), None, "570.124.06") is None


def test_gate() -> None:
    validator = pod("v25.3.4", name="nvidia-operator-validator-y")
    ok, detail = gate_verdict(node(), pod("570.124.06"), [validator], "570.124.06")
    assert ok and "570.124.06 ready" in detail
    bad = pod("560.0.0-bad", ready=False, restarts=11, waiting="CrashLoopBackOff")
    ok, detail = gate_verdict(node("upgrade-failed"), bad, [validator], "560.0.0-bad")
    assert not ok and detail == ("operator state upgrade-failed; driver pod phase Running, nvidia-driver-ctr "
                                 "CrashLoopBackOff, 11 restarts")
    assert gate_verdict(node(), pod("550.90.07"), [validator], "570.124.06") == (
        False, "driver pod runs 550.90.07, not 570.124.06")
    assert gate_verdict(node(), pod("570.124.06"), [], "570.124.06") == (
        False, "no validator pod on the node")
    unready = pod("v25.3.4", ready=False, name="nvidia-operator-validator-z")
    assert gate_verdict(node(), pod("570.124.06"), [unready], "570.124.06") == (
        False, "validator not ready: nvidia-operator-validator-z")
    sick = node(conditions=[{"type": "Ready", "status": "True"},
                            {"type": CONDITION, "status": "True",
                             "message": "PROBLEM: XID 79 on GPU 0000:3b:00"}])
    assert gate_verdict(sick, pod("570.124.06"), [validator], "570.124.06") == (
        False, f"{CONDITION}: PROBLEM: XID 79 on GPU 0000:3b:00")


def test_node_fault_and_cordons() -> None:
    assert node_fault(node()) is None
    lost = node(conditions=[{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}])
    assert node_fault(lost) == "node not Ready (NodeStatusUnknown)"
    assert cordoned_by(node()) is None
    assert cordoned_by(node(unschedulable=True)) == "cordoned (spec.unschedulable) by someone else"
    mark = "gpufleet-upgrade r1: driver -> 570.124.06"
    assert cordoned_by(node(unschedulable=True, mark=mark)) == mark  # another run's: not ours to take
    assert cordoned_by(node(unschedulable=True, mark=mark), frozenset({mark})) is None


def gpu_pod(name: str, node_name: str | None, phase: str = "Running", gpus: bool = True,
            deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default",
                            "labels": {"job-name": "train", "kueue.x-k8s.io/queue-name": "train"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    res = {"limits": {"nvidia.com/gpu": "8"}} if gpus else {"requests": {"cpu": "1"}}
    spec = {"nodeName": node_name, "containers": [{"name": "c", "resources": res}]}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_the_jobs_on_a_node_are_its_gpu_pods() -> None:
    pods = [gpu_pod("a", "gpu-0"), gpu_pod("b", "gpu-1"), gpu_pod("cpu", "gpu-1", gpus=False),
            gpu_pod("done", "gpu-2", phase="Succeeded"), gpu_pod("gone", "gpu-2", deleting=True),
            gpu_pod("unbound", None, phase="Pending")]
    assert gpu_jobs(pods) == {"gpu-0": [Job(id="default/a", name="train", queue="train")],
                              "gpu-1": [Job(id="default/b", name="train", queue="train")]}


def test_hand_back_clears_only_a_stale_upgrade_required() -> None:
    def named(name: str, state: str | None) -> dict[str, Any]:
        n = node(state)
        n["metadata"]["name"] = name
        return n

    nodes = [named("a", "upgrade-required"), named("b", "upgrade-required"), named("c", "upgrade-done"),
             named("d", "upgrade-required"), named("e", "upgrade-required")]
    drivers = {"a": pod("550.90.07"), "b": pod("560.0.0-bad"), "c": pod("550.90.07"), "d": pod("550.90.07")}
    # a: runs the template's version, stale; b: really behind the template; c: done; d: held by the
    # rollout (its gate's to judge); e: no driver pod.
    assert stale_required(nodes, drivers, "550.90.07", {"d"}) == ["a"]
    assert stale_required(nodes, drivers, "560.0.0-bad", set()) == ["b"]
    assert stale_required(nodes, drivers, None, set()) == []


# ----------------------------------------------------------------------------- the gate's inspect step


def published(node_name: str, pod: str | None, **kw: Any) -> dict[str, Any]:
    """The node's ConfigMap as its publisher writes it (the pool and SKU it claims are ignored)."""
    base: dict[str, Any] = dict(node=node_name, pool="what-the-node-says", sku=AcceleratorModel.H100_SXM,
                                at=5.0, expected_gpus=1, gpus=tuple(GpuObs(index=i) for i in range(8)),
                                ports=(PortObs(name="mlx5_0", state="up", speed_gbps=400.0),),
                                expected_port_gbps=400.0, driver_version="570.124.06",
                                firmware_version="96.00.89.00.01")
    base.update(kw)
    return publish_body(InspectObservation(**base), INSPECT_NAMESPACE, pod)


def gpu_node(name: str = "gpu-1", pool: str | None = "h200") -> dict[str, Any]:
    n = node(unschedulable=True)
    labels = {**n["metadata"]["labels"], **({POOL_LABEL: pool} if pool else {})}
    n["metadata"].update(name=name, labels=labels)
    return n


POOLS = {"h200": PoolShape(AcceleratorModel.H200_SXM, 8)}


def test_the_gate_judges_only_a_reading_published_after_the_publisher_restarted() -> None:
    # Nothing yet: wait.
    old = {"gpufleet-inspect-gpu-abcde"}
    waiting = (None, "no reading published since the publisher's restart")
    assert gate_reading(None, gpu_node(), old, POOLS) == waiting
    # The deleted pod's last reading (it may write once more while it terminates): wait.
    obs, why = gate_reading(published("gpu-1", "gpufleet-inspect-gpu-abcde"), gpu_node(), old, POOLS)
    assert obs is None and "last by gpufleet-inspect-gpu-abcde" in why
    # A reading that names no writer (a publisher run by hand, an older gpufleet) is never fresh.
    obs, why = gate_reading(published("gpu-1", None), gpu_node(), old, POOLS)
    assert obs is None and "does not name its publisher pod" in why
    # The new pod's reading; pool, SKU and GPU count are the stack's.
    obs, why = gate_reading(published("gpu-1", "gpufleet-inspect-gpu-fghij"), gpu_node(), old, POOLS)
    assert obs is not None and why == ""
    assert (obs.pool, obs.sku, obs.expected_gpus, obs.sched_state) == (
        "h200", AcceleratorModel.H200_SXM, 8, "drained")
    # Not the node's own, or a node of no pool: never judged.
    other, why = gate_reading(published("gpu-9", "new"), gpu_node(), old, POOLS)
    assert other is None and "describes node gpu-9" in why
    stray, why = gate_reading(published("gpu-1", "new"), gpu_node(pool=None), old, POOLS)
    assert stray is None and "in no pool of the stack" in why


def test_the_inspect_step_fails_a_node_the_operator_passed() -> None:
    catalog = load_catalog()
    rules, _ = xid_policy(catalog, {})
    setup = GateSetup(level="light", floor_percent=90.0, thresholds=load_thresholds(), xid_rules=rules,
                      component=Component.DRIVER, pins={"h200": Pins("550.90.07", "96.00.89.00.01")},
                      fault_actions={f.id: f.action for f in catalog})

    def judge(**kw: Any) -> tuple[bool, str]:
        obs, _ = gate_reading(published("gpu-1", "new", **kw), gpu_node(), {"old"}, POOLS)
        assert obs is not None
        v = inspect_gate(obs, setup, "570.124.06")
        return v.passed, v.detail

    assert judge() == (True, "inspect light ok")
    # NVML still reports the old driver (its kernel module was never unloaded): drift fails the gate.
    passed, detail = judge(driver_version="550.90.07")
    assert not passed and "driver-drift" in detail, detail
    ecc = tuple(GpuObs(index=i, ecc_uncorrectable_volatile=2.0 if i == 5 else 0.0) for i in range(8))
    passed, detail = judge(gpus=ecc)
    assert not passed and "GFI013 ecc-uncorrectable GPU 5" in detail, detail
    passed, detail = judge(gpus=tuple(GpuObs(index=i) for i in range(7)))  # a GPU fell off the bus
    assert not passed and "gpu-count" in detail, detail


def test_a_reference_nodes_figure_is_the_median_of_its_runs() -> None:
    # The run that read 2.52 on the sandbox (one outlier) does not set the node's figure.
    runs = [{"gloo_allreduce_busbw_gbs": 2.52, "h2d_gbs": 10.0}, {"gloo_allreduce_busbw_gbs": 1.82},
            {"gloo_allreduce_busbw_gbs": 1.9, "h2d_gbs": 12.0}]
    assert median_figures(runs) == {"gloo_allreduce_busbw_gbs": 1.9, "h2d_gbs": 11.0}
    assert median_figures([{"x": 3.0}]) == {"x": 3.0}
    assert median_figures([]) == {}


def test_reference_nodes_are_idle_able_and_bounded_per_pool() -> None:
    def n(name: str, pool: str | None, cordoned: bool = False, ready: bool = True) -> dict[str, Any]:
        out = node(state=None, unschedulable=cordoned,
                   conditions=[{"type": "Ready", "status": "True" if ready else "False"}])
        out["metadata"].update(name=name, labels={POOL_LABEL: pool} if pool else {})
        return out

    nodes = [n("h-4", "h200"), n("h-1", "h200"), n("h-2", "h200"), n("h-3", "h200"), n("h-5", "h200"),
             n("c-1", "h200", cordoned=True), n("d-1", "h200", ready=False), n("x-1", None),
             n("b-1", "b200"), n("k-1", "b200")]
    got = reference_candidates(nodes, busy={"h-1"}, per_pool=3, can_run=lambda name: name != "k-1")
    # h-1 runs a GPU job (jobs take precedence), c-1 is cordoned, d-1 not Ready, x-1 in no pool,
    # k-1 cannot run a container; three per pool at most, by name.
    assert got == {"h200": ["h-2", "h-3", "h-4"], "b200": ["b-1"]}
