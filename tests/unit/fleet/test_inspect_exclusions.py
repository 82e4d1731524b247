"""Jobs that excluded a node, from `scontrol -o show job` lines (pure)."""

from __future__ import annotations

import time

import pytest

from gpufleet.fleet.inspect.exclusions import expand_hostlist, job_exclusions


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
