"""Jobs that excluded a node, from `scontrol -o show job` lines (pure)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.fleet.inspect.exclusions import (
    HOSTNAME_LABEL,
    expand_hostlist,
    job_exclusions,
    pod_excludes,
    pod_exclusions,
)


@pytest.mark.parametrize(("text", "nodes"), [
    ("gpu-3", ["gpu-3"]),
    ("gpu-[0-2,5],spare-1", ["gpu-0", "gpu-1", "gpu-2", "gpu-5", "spare-1"]),
    ("node[008-010]", ["node008", "node009", "node010"]),
    ("a,b", ["a", "b"]),
])
def test_expand_hostlist(text: str, nodes: list[str]) -> None:
    assert expand_hostlist(text) == nodes


def _t(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def test_exclusions_count_jobs_after_each_nodes_previous_sweep() -> None:
    t0 = 1_800_000_000.0
    lines = "\n".join([
        f"JobId=1 JobName=a SubmitTime={_t(t0 + 10)} ExcNodeList=gpu-[1,3] NodeList=gpu-0",
        f"JobId=2 JobName=b SubmitTime={_t(t0 + 20)} ExcNodeList=gpu-1 NodeList=gpu-2",
        f"JobId=3 JobName=c SubmitTime={_t(t0 + 30)} ExcNodeList=(null) NodeList=gpu-1",
        f"JobId=4 JobName=d SubmitTime={_t(t0 - 50)} ExcNodeList=gpu-1 NodeList=gpu-0",
    ])
    assert job_exclusions(lines, {}, default_since=t0) == {"gpu-1": 2, "gpu-3": 1}
    # gpu-1 was swept after job 1: only job 2 is new for it
    assert job_exclusions(lines, {"gpu-1": t0 + 15}, default_since=t0) == {"gpu-1": 1, "gpu-3": 1}


# --- Kubernetes: the pods' required node affinity --------------------------------------------------

T0 = 1_800_000_000.0


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _pod(name: str, created: float, terms: list[dict[str, Any]] | None, owner: str | None = None,
         soft: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "train", "uid": f"uid-{name}",
                            "creationTimestamp": _iso(created)}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "uid": f"uid-{owner}", "controller": True}]
    rule = {"nodeSelectorTerms": terms} if terms is not None else None
    key = ("preferredDuringSchedulingIgnoredDuringExecution" if soft
           else "requiredDuringSchedulingIgnoredDuringExecution")
    spec: dict[str, Any] = {"affinity": {"nodeAffinity": {key: rule}}} if rule else {}
    return {"metadata": meta, "spec": spec}


def _not_in(*names: str, key: str = HOSTNAME_LABEL) -> dict[str, Any]:
    return {"key": key, "operator": "NotIn", "values": list(names)}


NODES = [{"metadata": {"name": f"gpu-{i}", "labels": {HOSTNAME_LABEL: f"host-{i}"}}} for i in range(4)]


def test_a_jobs_pods_count_once_and_only_after_the_nodes_previous_sweep() -> None:
    pods = [
        # a Job of 3 pods keeping off host-1 (hostname label -> node name gpu-1)
        *[_pod(f"a-{i}", T0 + 10 + i, [{"matchExpressions": [_not_in("host-1")]}], owner="a")
          for i in range(3)],
        # a bare pod keeping off gpu-1 and gpu-3 by node name
        _pod("b", T0 + 20, [{"matchFields": [_not_in("gpu-1", "gpu-3", key="metadata.name")]}]),
        # before gpu-1's previous sweep: not counted again
        _pod("c", T0 - 5, [{"matchExpressions": [_not_in("host-1")]}], owner="c"),
        # a preferred affinity is not an exclusion; an In on the hostname is a pin, not an exclusion
        _pod("d", T0 + 30, [{"matchExpressions": [_not_in("host-2")]}], soft=True),
        _pod("e", T0 + 30, [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In",
                                                   "values": ["host-0"]}]}]),
    ]
    assert pod_exclusions(pods, NODES, {"gpu-1": T0}) == {"gpu-1": 2, "gpu-3": 1}
    # The Job's first pod was created before the sweep, a later one after: the job was counted then.
    assert pod_exclusions(pods, NODES, {"gpu-1": T0 + 11}) == {"gpu-1": 1, "gpu-3": 1}


def test_ored_terms_exclude_only_what_every_term_excludes() -> None:
    terms = [{"matchExpressions": [_not_in("host-1", "host-2")]},
             {"matchExpressions": [_not_in("host-2")],
              "matchFields": [_not_in("gpu-3", key="metadata.name")]}]
    assert pod_excludes(_pod("x", T0, terms), {"host-1": "gpu-1", "host-2": "gpu-2"}) == {"gpu-2"}
    assert pod_excludes(_pod("y", T0, [{"matchExpressions": [_not_in("host-9")]}]), {}) == {"host-9"}
    assert pod_excludes(_pod("z", T0, None), {}) == set()


def test_a_pod_without_a_readable_creation_time_is_not_counted() -> None:
    p = _pod("x", T0, [{"matchExpressions": [_not_in("host-1")]}])
    p["metadata"]["creationTimestamp"] = "yesterday"
    assert pod_exclusions([p], NODES, {}) == {}
