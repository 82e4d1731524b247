"""Names, addresses and paths of a sandbox run (gpufleet.sandbox.layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.config.load import load_named_stack, parse_stack
from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError
from gpufleet.sandbox import layout as L

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def spec() -> StackSpec:
    return load_named_stack("sandbox", REPO / "stacks")


def test_nodes_compute_then_spare_with_addresses(spec: StackSpec) -> None:
    lay = L.plan_layout("sandbox", spec, "a1b2c3", Path("/r/run-a1b2c3"))
    assert [n.name for n in lay.nodes] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert [n.role for n in lay.nodes] == ["compute"] * 4 + ["spare"]
    assert [n.name for n in lay.spare_nodes] == ["gpu-4"]
    assert lay.head.mgmt_ip == "10.77.0.1"
    assert [n.mgmt_ip for n in lay.nodes] == [f"10.77.0.{10 + i}" for i in range(5)]
    assert lay.nodes[2].fabric == ((0, "fab0", "gfa1b2c3f2.0", "10.77.10.12"),)
    # The spare is used last: a higher Slurm Weight than every compute node.
    assert lay.nodes[-1].weight > max(n.weight for n in lay.compute_nodes)
    assert all(n.gpus == 8 for n in lay.nodes)


def test_every_kernel_name_carries_the_run_id_and_fits_ifnamsiz(spec: StackSpec) -> None:
    lay = L.plan_layout("sandbox", spec, "ffffff", Path("/r"))
    names = lay.bridges + lay.root_links
    assert len(names) == len(set(names))
    assert all(len(n) <= 15 and "ffffff" in n for n in names)
    assert all("ffffff" in ns for ns in lay.namespaces)
    assert len(lay.namespaces) == 6  # head + 5 nodes


def test_two_runs_share_no_name(spec: StackSpec) -> None:
    a = L.plan_layout("sandbox", spec, "000001", Path("/r/a"))
    b = L.plan_layout("sandbox", spec, "000002", Path("/r/b"))
    for attr in ("bridges", "root_links", "namespaces"):
        assert not set(getattr(a, attr)) & set(getattr(b, attr)), attr


def test_ifname_limit_is_enforced() -> None:
    assert L.check_ifname("a" * 15) == "a" * 15
    with pytest.raises(ValueError, match="interface name"):
        L.check_ifname("a" * 16)
    with pytest.raises(ValueError):
        L.check_ifname("bad name")


def test_sixteen_rails_and_many_nodes_still_fit(spec: StackSpec) -> None:
    data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    data["fabric"].update(railsPerNode=8, nicsPerNode=8)
    data["nodePools"][0].update(nodes=100, spares=10)
    data["nodePools"][0]["topology"] = {"nodesPerRack": 1, "nodesPerLeaf": 5}
    lay = L.plan_layout("big", parse_stack(data, "x"), "abcdef", Path("/r"))
    assert all(len(n) <= 15 for n in lay.root_links + lay.bridges)
    assert lay.nodes[109].fabric[7][3] == "10.77.17.119"


def test_run_id_is_validated(spec: StackSpec) -> None:
    assert L.check_run_id(L.new_run_id())
    with pytest.raises(ValueError):
        L.plan_layout("sandbox", spec, "ZZZ", Path("/r"))


def test_a_stack_without_sandbox_pools_is_rejected_with_paths() -> None:
    spec = load_named_stack("h200-ib", REPO / "stacks")
    with pytest.raises(InputError) as e:
        L.plan_layout("h200-ib", spec, "abcdef", Path("/r"))
    paths = {p.path for p in e.value.problems}
    assert {"sandbox", "nodePools"} <= paths


def test_hosts_map_names_fabric_rail_zero(spec: StackSpec) -> None:
    lay = L.plan_layout("sandbox", spec, "abcdef", Path("/r"))
    hosts = lay.hosts_map()
    assert hosts["gpu-1"] == {"mgmt_ip": "10.77.0.11", "fabric_ip": "10.77.10.11", "fabric_ifname": "fab0"}
    assert set(hosts) == {f"gpu-{i}" for i in range(5)}


def test_paths_live_under_the_run_directory(spec: StackSpec) -> None:
    lay = L.plan_layout("sandbox", spec, "abcdef", Path("/r/run-abcdef"))
    for p in (
        lay.agent_socket("gpu-0"),
        lay.munge_socket,
        lay.slurm_conf,
        lay.checkpoint_dir,
        lay.events_file,
    ):
        assert str(p).startswith("/r/run-abcdef/")
    # AF_UNIX paths hold at most 107 bytes (unix(7), sun_path).
    assert len(str(lay.agent_socket("gpu-0"))) < 108


def test_the_training_job_checkpoints_on_the_juicefs_volume_when_the_stack_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from gpufleet.core.storage_contract import StorageSandboxState, write_storage_state
    from gpufleet.sandbox import up, workload

    stack = "sandbox-storage-juicefs"
    jspec = load_named_stack(stack, REPO / "stacks")
    # Without the storage sandbox, bring-up is refused before anything is made (exit 2's InputError).
    with pytest.raises(InputError, match=r"storage\.checkpoint\.location.*which is not up"):
        up._checkpoints_on_storage(stack, jspec, tmp_path, "a1b2c3")
    mnt = tmp_path / "run-s" / "juicefs" / "mnt"
    state = StorageSandboxState.model_validate(
        {"stack": stack, "run_id": "s", "phase": "up", "base_dir": str(tmp_path / "run-s"), "created_at": 0.0,
         "juicefs": {"name": "jfs", "meta_url": "redis://127.0.0.1:7001/1", "meta_port": 7001, "meta_db": 1,
                     "meta_dir": str(mnt.parent / "redis"), "scratch_port": 7002, "bucket": "jfs-data",
                     "mountpoint": str(mnt), "cache_dir": str(mnt.parent / "cache"), "cache_mib": 512,
                     "metrics": "127.0.0.1:7003", "checkpoint_dir": str(mnt / "checkpoints")}}
    )
    write_storage_state(state, tmp_path)
    monkeypatch.setattr(up.jfs, "mounted", lambda p: p == mnt)
    root = up._checkpoints_on_storage(stack, jspec, tmp_path, "a1b2c3")
    assert root == mnt / "checkpoints" / "job-a1b2c3"
    lay = replace(L.plan_layout(stack, jspec, "a1b2c3", tmp_path / "run-a1b2c3"), checkpoint_root=root)
    assert lay.checkpoint_dir == root
    assert f"--checkpoint-dir {root}" in workload.job_script(lay, "/usr/bin/python3")
    # A stack that checkpoints on S3 keeps the job's checkpoints in its run folder.
    s3 = load_named_stack("sandbox-storage", REPO / "stacks")
    assert up._checkpoints_on_storage("sandbox-storage", s3, tmp_path, "a1b2c3") is None
    assert L.plan_layout("sandbox", s3, "a1b2c3", Path("/r")).checkpoint_dir == Path("/r/checkpoints")


def test_a_run_folder_too_deep_for_slurmstepds_sockets_is_refused_before_anything_is_made() -> None:
    stack = "sandbox-storage-juicefs"
    jspec = load_named_stack(stack, REPO / "stacks")
    # The folder pytest gave the JuiceFS tests: slurmstepd could not make its socket and every job
    # was cancelled at launch ("Unix socket path ... is too long. (116 > 108)").
    deep = Path(f"/tmp/pytest-of-root/pytest-34/juicefs-root0/{stack}/run-e7656c")
    with pytest.raises(InputError, match=r"too deep: slurmstepd's sockets under it would take up to 112 b"):
        L.plan_layout(stack, jspec, "e7656c", deep)
    ok = L.plan_layout(stack, jspec, "e7656c", Path(f"/run/gpufleet/sandboxes/{stack}/run-e7656c"))
    assert L.socket_path_problems(ok) == []
    # The longest socket allowed for: node gpu-4, a 4-digit job id, the batch step.
    longest = f"{ok.spool_dir('gpu-4')}/gpu-4_9999.4294967291"
    assert len(longest) <= L.SUN_PATH_MAX
