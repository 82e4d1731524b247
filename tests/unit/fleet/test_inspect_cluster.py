"""Inspect's Kubernetes source (pure): the ConfigMap a node publishes, the scheduler's view from Nodes
and pods, and the observations a sweep judges (a node that published nothing, something stale,
unreadable or another node's is UNKNOWN with the reason)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.config import AcceleratorModel
from gpufleet.config.placement import POOL_LABEL
from gpufleet.core.inspect_contract import DATA_KEY, NODE_LABEL, configmap_name
from gpufleet.fleet.inspect.cluster import (
    PoolShape,
    gpus_in_use,
    observations_from_cluster,
    publish_body,
    sched_state,
)
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation

POOLS = {"h200": PoolShape(AcceleratorModel.H200_SXM, 8)}
NOW = 10_000.0


def node(name: str, pool: str | None = "h200", ready: str = "True", cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {POOL_LABEL: pool} if pool else {}},
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def pod(node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"p-{node_name}-{gpus}"}, "spec": {"nodeName": node_name, "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "4"},
                                    "requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def published(name: str, at: float, **kw: Any) -> NodeObservation:
    gpus = tuple(GpuObs(index=i) for i in range(8))
    base: dict[str, Any] = {"node": name, "pool": "gpu", "sku": AcceleratorModel.H100_SXM, "at": at,
                            "expected_gpus": 4, "gpus": gpus, "driver_version": "570.124.06"}
    return NodeObservation(**{**base, **kw})


def test_the_published_configmap() -> None:
    obs = published("gpu-1", NOW)
    body = publish_body(obs, "gpufleet-system")
    assert body["metadata"]["name"] == "inspect-gpu-1"
    assert body["metadata"]["namespace"] == "gpufleet-system"
    assert body["metadata"]["labels"][NODE_LABEL] == "gpu-1"
    assert NodeObservation.model_validate_json(body["data"][DATA_KEY]) == obs
    long = "n" * 250
    assert len(configmap_name(long)) == 253 and configmap_name(long) != configmap_name(long[:-1] + "m")
    assert len(publish_body(published(long, NOW), "ns")["metadata"]["labels"][NODE_LABEL]) == 63


def test_gpus_in_use_counts_live_gpu_pods_only() -> None:
    pods = [pod("a", 8), pod("b", 2), pod("b", 1, "Pending"), pod("c", 4, "Succeeded"),
            {"metadata": {"name": "cpu"}, "spec": {"nodeName": "c", "containers": [{"name": "x"}]},
             "status": {"phase": "Running"}}]
    assert gpus_in_use(pods) == {"a": 8, "b": 3, "c": 0}


@pytest.mark.parametrize(("n", "in_use", "want"), [
    (node("a"), 0, "idle"), (node("a"), 3, "mixed"), (node("a"), 8, "allocated"),
    (node("a", cordoned=True), 0, "drained"), (node("a", cordoned=True), 2, "draining"),
    (node("a", ready="Unknown"), 0, "down"), (node("a", ready="False", cordoned=True), 0, "down"),
])
def test_sched_state(n: dict[str, Any], in_use: int, want: str) -> None:
    assert sched_state(n, in_use, 8) == want


def cm(obs: NodeObservation | str, name: str) -> dict[str, Any]:
    text = obs if isinstance(obs, str) else obs.model_dump_json()
    return {"metadata": {"name": configmap_name(name), "labels": {NODE_LABEL: name}},
            "data": {DATA_KEY: text}}


def test_observations_take_the_stacks_view_and_refuse_what_cannot_be_judged() -> None:
    nodes = [node("gpu-0"), node("gpu-1", cordoned=True), node("gpu-2"), node("gpu-3"), node("gpu-4"),
             node("gpu-5"), node("cpu-0", pool=None), node("other-0", pool="not-in-stack")]
    cms = [cm(published("gpu-0", NOW - 60), "gpu-0"), cm(published("gpu-1", NOW - 10), "gpu-1"),
           cm(published("gpu-2", NOW - 901), "gpu-2"), cm("{not json", "gpu-3"),
           cm(published("gpu-9", NOW), "gpu-4")]
    obs = observations_from_cluster(nodes, cms, [pod("gpu-0", 8)], POOLS, now=NOW)
    by = {o.node: o for o in obs}
    assert sorted(by) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]  # the stack's pools only
    # What the node read is kept; pool, SKU, expected count and the scheduler's view are the stack's.
    g0 = by["gpu-0"]
    assert (g0.pool, g0.sku, g0.expected_gpus, g0.sched_state) == ("h200", AcceleratorModel.H200_SXM, 8,
                                                                    "allocated")
    assert g0.gpus is not None and len(g0.gpus) == 8 and g0.driver_version == "570.124.06"
    assert g0.at == NOW - 60 and g0.unknown == ()
    assert by["gpu-1"].sched_state == "drained"
    for name, why in (("gpu-2", "last published 901 s ago (older than 900 s)"),
                      ("gpu-3", "ConfigMap inspect-gpu-3: unreadable observation"),
                      ("gpu-4", "ConfigMap inspect-gpu-4 describes node gpu-9, not gpu-4"),
                      ("gpu-5", "no inspect result published by the node")):
        o = by[name]
        assert o.gpus is None and o.ports is None and o.at == NOW, name
        assert len(o.unknown) == 1 and o.unknown[0].startswith(why), (name, o.unknown)
    assert observations_from_cluster(nodes, cms, [], POOLS, now=NOW, max_age_s=1000)[2].unknown == ()


def test_a_published_observation_round_trips_through_json() -> None:
    obs = published("gpu-0", NOW, unknown=("xid: dmesg: denied",))
    doc = json.loads(publish_body(obs, "ns")["data"][DATA_KEY])
    assert doc["node"] == "gpu-0" and doc["unknown"] == ["xid: dmesg: denied"]


def test_the_jobs_that_excluded_a_node_since_its_previous_sweep_are_counted() -> None:
    avoid = {"metadata": {"name": "train-0", "uid": "u0", "creationTimestamp": "2026-12-06T00:00:10Z",
                          "ownerReferences": [{"kind": "Job", "uid": "j", "controller": True}]},
             "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                 "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                         "values": ["gpu-1"]}]}]}}}},
             "status": {"phase": "Succeeded"}}
    nodes = [node("gpu-0"), node("gpu-1")]
    cms = [cm(published("gpu-0", NOW), "gpu-0"), cm(published("gpu-1", NOW), "gpu-1")]
    sweep = 1_796_515_200.0  # 2026-12-06T00:00:00Z
    by = {o.node: o for o in observations_from_cluster(nodes, cms, [avoid], POOLS, now=NOW,
                                                         since={"gpu-1": sweep})}
    assert (by["gpu-0"].job_exclusions, by["gpu-1"].job_exclusions) == (0, 1)
    assert by["gpu-1"].sched_state == "idle"  # a finished pod holds no GPU
    later = observations_from_cluster(nodes, cms, [avoid], POOLS, now=NOW, since={"gpu-1": sweep + 11})
    assert [o.job_exclusions for o in later] == [0, 0]
