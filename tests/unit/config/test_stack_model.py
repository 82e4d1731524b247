"""The stack model: shipped stacks load, derived figures are right, all errors come at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.config import (
    AcceleratorModel,
    Vendor,
    accelerator_spec,
    all_specs,
    collective_environment,
    load_stack,
    parse_stack,
)
from gpufleet.config.model import FabricKind, FabricSpec, Secret, duration_seconds
from gpufleet.core.errors import InputError, format_path

STACKS = sorted((Path(__file__).parents[3] / "stacks").glob("Pulumi.*.yaml"))


def minimal() -> dict[str, Any]:
    return {
        "cluster": {"name": "t", "environment": "staging"},
        "nodePools": [
            {"name": "a", "accelerator": "nvidia-h100-sxm", "gpusPerNode": 8, "nodes": 4, "spares": 1,
             "provisioning": {"kind": "static", "nodeNamePattern": "gpu-{index:02d}"}}
        ],
        "fabric": {"kind": "infiniband", "railsPerNode": 8, "nicsPerNode": 8, "linkSpeedGbps": 400,
                   "mode": "rdma-shared"},
        "storage": {"checkpoint": {"location": "/ckpt"}},
        "scheduler": {"kind": "volcano", "queues": [{"name": "q"}]},
    }


@pytest.mark.parametrize("path", STACKS, ids=lambda p: p.stem)
def test_shipped_stacks_load(path: Path) -> None:
    stack = load_stack(path)
    assert stack.total_gpus == sum(p.total_gpus for p in stack.node_pools) > 0


def test_sandbox_stack_shape() -> None:
    stack = load_stack(Path(__file__).parents[3] / "stacks" / "Pulumi.sandbox.yaml")
    (pool,) = stack.node_pools
    assert (pool.nodes, pool.spares, pool.gpus_per_node) == (4, 1, 8)
    assert pool.node_names() == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert stack.sandbox is not None and stack.sandbox.slurm.slurmd_timeout == 10


def test_derived_figures() -> None:
    stack = parse_stack(minimal(), "t.yaml")
    assert stack.total_nodes == 5
    assert stack.total_gpus == 40
    assert stack.peak_bf16_pflops == pytest.approx(40 * 989.0 / 1000)
    assert stack.node_pools[0].node_names()[-1] == "gpu-04"


def test_configured_zero_is_kept() -> None:
    data = minimal()
    data["nodePools"][0]["spares"] = 0
    data["storage"]["checkpoint"]["writeSeconds"] = 0
    stack = parse_stack(data, "t.yaml")
    assert stack.node_pools[0].spares == 0
    assert stack.storage.checkpoint.write_seconds == 0.0


def test_all_errors_reported_at_once_with_paths() -> None:
    data = minimal()
    data["nodePools"][0]["gpusPerNode"] = 0
    data["nodePools"].append({**minimal()["nodePools"][0], "name": "b", "colour": "red"})
    data["fabric"]["linkSpeedGbps"] = 300
    with pytest.raises(InputError) as exc:
        parse_stack(data, "s.yaml")
    paths = {p.path for p in exc.value.problems}
    assert {"nodePools[0].gpusPerNode", "nodePools[1].colour", "fabric.linkSpeedGbps"} <= paths
    assert "s.yaml" in str(exc.value)


def test_secret_is_opaque() -> None:
    s = Secret.model_validate({"secure": "v1:xyz"})
    assert str(s) == repr(s) == "[secret]"
    assert s.is_encrypted
    with pytest.raises(ValueError):
        s.reveal()
    plain = Secret.model_validate("redis://pw@host")
    assert plain.reveal() == "redis://pw@host" and "pw" not in repr(plain)


@pytest.mark.parametrize(
    ("loc", "text"),
    [(("nodePools", 1, "gpusPerNode"), "nodePools[1].gpusPerNode"), ((), "(top level)"), (("a", "b"), "a.b")],
)
def test_format_path(loc: tuple[str | int, ...], text: str) -> None:
    assert format_path(loc) == text


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("15d", 1296000), ("500ms", 0.5), ("2m", 120)])
def test_duration_seconds(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def fabric(**kw: Any) -> FabricSpec:
    base = {"kind": "infiniband", "rails_per_node": 2, "nics_per_node": 2, "link_speed_gbps": 400,
            "mode": "rdma-shared", "mgmt_interface": "bond0"}
    return FabricSpec.model_validate(base | kw)


# Table test: fabric -> collective environment (conventions.md, "NCCL environment by fabric").
@pytest.mark.parametrize(
    ("fab", "vendor", "must", "must_not"),
    [
        (fabric(), Vendor.NVIDIA,
         {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "bond0", "NCCL_COLLNET_ENABLE": "0"},
         {"NCCL_IB_GID_INDEX", "FI_PROVIDER"}),
        (fabric(hcas=["mlx5_0", "mlx5_3"], sharp=True), Vendor.NVIDIA,
         {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1", "NCCL_COLLNET_ENABLE": "1"}, {"NCCL_IB_TC"}),
        (fabric(kind="roce", gid_index=7), Vendor.AMD,
         {"NCCL_IB_GID_INDEX": "7", "NCCL_IB_TC": "106", "NCCL_IB_RETRY_CNT": "7"}, {"FI_PROVIDER"}),
        (fabric(kind="efa", mode="efa"), Vendor.NVIDIA,
         {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}, {"NCCL_IB_HCA"}),
        (fabric(kind="roce"), Vendor.HUAWEI,
         {"HCCL_SOCKET_IFNAME": "bond0", "HCCL_RDMA_TC": "424"}, {"NCCL_IB_HCA"}),
    ],
)
def test_collective_environment(
    fab: FabricSpec, vendor: Vendor, must: dict[str, str], must_not: set[str]
) -> None:
    env = collective_environment(fab, vendor)
    assert {k: env.get(k) for k in must} == must
    assert not must_not & env.keys()
    assert list(env) == sorted(env)


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"rails_per_node": 9, "nics_per_node": 8}, "railsPerNode (9) exceeds nicsPerNode (8)"),
        ({"hcas": ["mlx5_0"]}, "hcas lists 1 HCAs but railsPerNode is 2"),
        ({"kind": "efa"}, "mode rdma-shared does not fit fabric kind efa"),
        ({"kind": "roce", "sharp": True}, "sharp (in-network reduction) needs kind infiniband"),
    ],
)
def test_impossible_fabrics(kw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        fabric(**kw)
    assert FabricKind.INFINIBAND.value == "infiniband"


def test_accelerator_table_is_complete_and_sane() -> None:
    assert {s.model for s in all_specs()} == set(AcceleratorModel)
    for spec in all_specs():
        assert spec.memory_gib > 0 and spec.bf16_dense_tflops > 100
        assert "/" in spec.resource_name
    assert accelerator_spec(AcceleratorModel.MI300X).resource_name == "amd.com/gpu"
    assert accelerator_spec(AcceleratorModel.ASCEND_910B).node_labels["accelerator"] == "huawei-Ascend910"
    h100 = accelerator_spec(AcceleratorModel.H100_SXM)
    assert h100.node_labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_stack_file_with_other_namespaces(tmp_path: Path) -> None:
    doc = {"config": {"kubernetes:context": "x", **{f"gpufleet:{k}": v for k, v in minimal().items()}}}
    p = tmp_path / "Pulumi.t.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert load_stack(p).cluster.name == "t"
    doc["config"]["nonamespace"] = 1
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match="keys need a namespace"):
        load_stack(p)


def sandbox_with_serving(**serving: Any) -> dict[str, Any]:
    doc = minimal()
    doc["cluster"]["environment"] = "sandbox"
    doc["scheduler"] = {"kind": "slurm", "queues": [{"name": "q"}]}
    doc["nodePools"] = [
        {"name": "gpu", "accelerator": "nvidia-h100-sxm", "gpusPerNode": 8, "nodes": 2,
         "provisioning": {"kind": "sandbox"}},
        {"name": "srv", "accelerator": "nvidia-h100-sxm", "gpusPerNode": 1, "nodes": 2,
         "provisioning": {"kind": "sandbox"}},
    ]
    doc["sandbox"] = {"training": {"nodes": 2}, "serving": {"pool": "srv", **serving}}
    doc["slos"] = {"serving": {"availability": 0.999, "p99Ms": 300, "recoverS": 5}}
    return doc


def test_a_serving_pool_and_its_targets() -> None:
    stack = parse_stack(sandbox_with_serving(users=10, ratePerUser=4), "t.yaml")
    assert stack.sandbox is not None and stack.sandbox.serving is not None
    s = stack.sandbox.serving
    assert (s.pool, s.port, s.stats_port, s.health) == ("srv", 8080, 8404, "ready")
    assert (s.users, s.rate_per_user) == (10, 4)
    assert stack.slos.serving is not None and stack.slos.serving.p99_ms == 300
    assert stack.slos.serving.window_availability == 0.99  # the default
    # The serving pool's nodes do not count for the training job: 3 training nodes exceed the 2.
    doc = sandbox_with_serving()
    doc["sandbox"]["training"]["nodes"] = 3
    with pytest.raises(InputError, match=r"sandbox.training.nodes \(3\) exceeds the 2 compute nodes"):
        parse_stack(doc, "t.yaml")
    doc = sandbox_with_serving()
    doc["nodePools"] = doc["nodePools"][1:]
    doc["sandbox"]["training"]["nodes"] = 1
    with pytest.raises(InputError, match="the training job needs another sandbox pool"):
        parse_stack(doc, "t.yaml")
    with pytest.raises(InputError, match="at most 2000/s"):
        parse_stack(sandbox_with_serving(users=200, ratePerUser=20), "t.yaml")
