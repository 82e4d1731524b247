"""The Kubernetes sandbox makes a stack's Ceph storage nodes, as they join a cluster: no GPU, no
taint, and none of the labels the Pulumi program's node patches give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.config import StackSpec, load_named_stack
from gpufleet.config.placement import node_labels
from gpufleet.core.errors import InputError
from gpufleet.infra.storage import storage_node_labels
from gpufleet.sandbox.kube.nodes import STORAGE_POOL, plan_nodes, plan_storage_nodes

STACKS = Path(__file__).resolve().parents[3] / "stacks"


@pytest.fixture(scope="module")
def h200() -> StackSpec:
    return load_named_stack("h200-ib", STACKS)


def test_every_storage_node_of_the_stack_is_made_unlabelled(h200: StackSpec) -> None:
    ceph = h200.storage.ceph
    assert ceph is not None
    nodes = plan_storage_nodes(h200)
    assert [n.name for n in nodes] == [s.name for s in ceph.storage_nodes]
    for node, storage in zip(nodes, ceph.storage_nodes, strict=True):
        assert node.pool == STORAGE_POOL and not node.spare and node.taints == ()
        assert not any(k.endswith("/gpu") or k.startswith("huawei.com") for k in node.capacity)
        # What the program's patch adds is not there before it runs.
        added = storage_node_labels(ceph, storage.rack)
        assert not set(added) & set(node.labels)
        assert node.labels["kubernetes.io/hostname"] == node.name
        assert node.manifest()["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}


def test_gpu_nodes_are_the_pools_and_storage_nodes_come_apart(h200: StackSpec) -> None:
    gpu = plan_nodes(h200)
    pool = h200.node_pools[0]
    assert [n.name for n in gpu] == pool.node_names()
    assert gpu[5].labels.items() >= node_labels(pool, 5).items()
    assert not {n.name for n in gpu} & {n.name for n in plan_storage_nodes(h200)}


def test_no_ceph_no_storage_nodes() -> None:
    assert plan_storage_nodes(load_named_stack("scale-10k", STACKS)) == []


def test_a_storage_node_named_like_a_gpu_node_is_refused(h200: StackSpec) -> None:
    ceph = h200.storage.ceph
    assert ceph is not None
    clash = ceph.storage_nodes[1].model_copy(update={"name": h200.node_pools[0].node_names()[0]})
    nodes = [ceph.storage_nodes[0], clash, *ceph.storage_nodes[2:]]
    storage = h200.storage.model_copy(update={"ceph": ceph.model_copy(update={"storage_nodes": nodes})})
    spec = h200.model_copy(update={"storage": storage})
    with pytest.raises(InputError) as e:
        plan_storage_nodes(spec)
    assert "storage.ceph.storageNodes[1].name" in e.value.render()


def test_cluster_only_refuses_the_training_job_before_anything_is_made(tmp_path: Path) -> None:
    """`--cluster-only` (no platform stand-ins: the Pulumi program deploys the platform) has no
    queue for the training Job; asking for both is an input error, raised before any process."""
    from gpufleet.sandbox.kube.cluster import KubeUpOptions, kube_up

    spec = load_named_stack("sandbox", STACKS)
    with pytest.raises(InputError) as e:
        kube_up("sandbox", spec, KubeUpOptions(training=True, platform=False), root=tmp_path)
    assert "--no-training" in e.value.render()
    assert list(tmp_path.iterdir()) == []


def test_cluster_only_needs_kubernetes() -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    result = CliRunner().invoke(app, ["sandbox", "up", "--cluster-only"])
    assert result.exit_code == 2 and "--kubernetes" in result.output
