"""The Slurm cluster's inspect source (ADR 0088): sinfo's nodes, the stack's pools, the files the
nodes publish, and the command's refusals. The real Slurm run is tests/e2e/test_fleet_inspect.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.inspect_contract import PUBLISHED_MAX_BYTES, published_file_name
from gpufleet.fleet.inspect.cluster import PoolShape
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation
from gpufleet.fleet.inspect.slurm_cluster import (
    NOT_PUBLISHED,
    SlurmNode,
    SlurmPool,
    observations_from_slurm,
    parse_slurm_nodes,
    pool_of,
    read_published,
    write_published,
)

H100 = AcceleratorModel("nvidia-h100-sxm")
B200 = AcceleratorModel("nvidia-b200")
SINFO = """\
gpu-a01|idle|none|Unknown|batch*|h100,ib
gpu-a01|idle|none|Unknown|long|h100,ib
gpu-a02|drained|Xid 79|2026-12-06T10:00:00|batch*|(null)
gpu-b01|mixed|none|Unknown|b200|(null)
login1|idle|none|Unknown|debug|(null)
"""


def node(name: str, partitions: frozenset[str] = frozenset(), features: frozenset[str] = frozenset()
         ) -> SlurmNode:
    return SlurmNode(name, "idle", frozenset(partitions), frozenset(features))


def obs(name: str, at: float, **kw: object) -> NodeObservation:
    return NodeObservation(node=name, pool="whatever-it-said", sku=B200, at=at, expected_gpus=1,
                           gpus=tuple(GpuObs(index=i) for i in range(8)), **kw)


def test_sinfo_lines_merge_into_nodes_with_partitions_and_features() -> None:
    nodes = parse_slurm_nodes(SINFO)
    assert sorted(nodes) == ["gpu-a01", "gpu-a02", "gpu-b01", "login1"]
    assert nodes["gpu-a01"] == SlurmNode("gpu-a01", "idle", frozenset({"batch", "long"}),
                                         frozenset({"h100", "ib"}))
    assert nodes["gpu-a02"].state == "drained" and nodes["gpu-a02"].features == frozenset()


def test_a_node_joins_the_pool_that_lists_it_then_by_feature_then_by_partition() -> None:
    shape = PoolShape(H100, 8)
    listed = SlurmPool("listed", shape, frozenset({"gpu-a01"}))
    h100 = SlurmPool("h100", shape)
    batch = SlurmPool("batch", shape)
    pools = [batch, h100, listed]  # the stack's order decides only among matches of one kind
    nodes = parse_slurm_nodes(SINFO)
    assert pool_of(nodes["gpu-a01"], pools) is listed
    assert pool_of(node("x", frozenset({"batch"}), frozenset({"h100"})), pools) is h100
    assert pool_of(nodes["gpu-a02"], pools) is batch
    assert pool_of(nodes["login1"], pools) is None


def test_the_stack_and_slurm_say_what_a_node_is_and_what_was_not_published_is_unknown() -> None:
    nodes = parse_slurm_nodes(SINFO)
    pools = [SlurmPool("h100", PoolShape(H100, 8)), SlurmPool("b200", PoolShape(B200, 8))]
    now = 10_000.0
    published = {"gpu-a01": obs("gpu-a01", now - 60).model_dump_json(),
                 "gpu-b01": obs("gpu-a01", now - 60).model_dump_json()}  # gpu-a01's reading, misfiled
    denied = {"gpu-a02": "/shared/inspect-gpu-a02.json: Permission denied"}
    got = observations_from_slurm(nodes, published, denied, [*pools, SlurmPool("batch", PoolShape(H100, 8))],
                                  now=now, max_age_s=900, exclusions={"gpu-a01": 2})
    by = {o.node: o for o in got}
    assert sorted(by) == ["gpu-a01", "gpu-a02", "gpu-b01"]  # login1 belongs to no pool
    a01 = by["gpu-a01"]
    # Pool, SKU and GPU count from the stack (its h100 feature), not what the node said of itself.
    assert (a01.pool, a01.sku, a01.expected_gpus, a01.sched_state, a01.job_exclusions) == (
        "h100", H100, 8, "idle", 2)
    assert len(a01.gpus or ()) == 8 and a01.unknown == ()
    assert by["gpu-a02"].unknown == ("/shared/inspect-gpu-a02.json: Permission denied",)
    assert by["gpu-a02"].sched_state == "drained" and by["gpu-a02"].pool == "batch"
    assert by["gpu-b01"].unknown == ("inspect-gpu-b01.json describes node gpu-a01, not gpu-b01",)
    assert by["gpu-b01"].sched_state == "mixed" and by["gpu-b01"].gpus is None
    stale = observations_from_slurm(nodes, published, {}, pools, now=now + 1000, max_age_s=900)
    assert stale[0].unknown == ("last published 1060 s ago (older than 900 s)",)
    assert observations_from_slurm({"gpu-a01": nodes["gpu-a01"]}, {}, {}, pools, now=now)[0].unknown == (
        NOT_PUBLISHED,)


def test_a_published_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    o = obs("gpu-a01", 1.0)
    path = write_published(o, tmp_path)
    assert path == tmp_path / "inspect-gpu-a01.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    write_published(o.model_copy(update={"at": 2.0}), tmp_path)  # replaced, no temporary file left
    assert [p.name for p in tmp_path.iterdir()] == ["inspect-gpu-a01.json"]
    (tmp_path / "inspect-gpu-a02.json").mkdir()  # unreadable as a file
    texts, unreadable = read_published(tmp_path, ["gpu-a01", "gpu-a02", "gpu-a03"])
    assert json.loads(texts["gpu-a01"])["at"] == 2.0
    assert unreadable == {"gpu-a02": f"{tmp_path}/inspect-gpu-a02.json: Is a directory"}


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path: Path) -> None:
    # The folder is every node's: what one writes there costs one UNKNOWN node, never the sweep.
    write_published(obs("gpu-a01", 1.0), tmp_path)
    os.mkfifo(tmp_path / "inspect-gpu-a02.json")  # open(2) without O_NONBLOCK would wait for a writer
    (tmp_path / "inspect-gpu-a03.json").symlink_to(tmp_path / "inspect-gpu-a01.json")  # another's file
    (tmp_path / "inspect-gpu-a04.json").write_bytes(b" " * (PUBLISHED_MAX_BYTES + 1))
    (tmp_path / "inspect-gpu-a05.json").write_bytes(b"\xff\xfe")
    texts, unreadable = read_published(tmp_path, [f"gpu-a0{i}" for i in range(1, 6)])
    assert list(texts) == ["gpu-a01"]
    assert {n: why.split(": ", 1)[1] for n, why in unreadable.items()} == {
        "gpu-a02": "not a regular file",
        "gpu-a03": "Too many levels of symbolic links",
        "gpu-a04": f"larger than {PUBLISHED_MAX_BYTES} bytes",
        "gpu-a05": "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
    }


def test_a_file_name_holds_any_node_name_a_file_can() -> None:
    assert published_file_name("gpu-a01") == "inspect-gpu-a01.json"
    long = published_file_name("n" * 300)
    assert len(long.encode()) == 255 and long.endswith(".json")
    assert long != published_file_name("n" * 299)
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError, match="cannot name a file"):
            published_file_name(bad)


@pytest.mark.parametrize(("argv", "says"), [
    (["--slurm"], "give --publish-dir"),
    (["--slurm", "--here", "--publish-dir", "."], "not with --here or --kubernetes"),
    (["--publish-dir", "."], "give one of them"),
    (["--slurm", "--publish-dir", ".", "--out", "r", "--bundle"], "gpufleet bundle collect --real"),
    (["--slurm", "--publish-dir", "/no/such/dir"], "/no/such/dir: not a directory"),
    (["--slurm", "--publish-dir", ".", "--level", "full"], "stack sandbox sets no inspect.perfJob"),
    (["--max-age", "60"], "with --kubernetes or --slurm"),
])
def test_bad_slurm_input_exits_2_before_reading_slurm(argv: list[str], says: str) -> None:
    res = CliRunner().invoke(app, ["inspect", "--stack", "sandbox", "--no-record", *argv])
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output


SLURM_DOUBLE = """#!/bin/sh
# sinfo and scontrol's answers to gpufleet inspect --slurm (a test double; the e2e runs real Slurm).
case "${0##*/} $*" in
  "sinfo -h -N -o %N|%T|%E|%H|%P|%f") echo 'gpu-0|idle|none|Unknown|train*|gpu'
      echo 'gpu-1|allocated|none|Unknown|train*|gpu' ;;
  "scontrol -o show job") echo "JobId=7 ExcNodeList=gpu-1 SubmitTime=2026-12-06T10:00:00" ;;
  *) echo "unexpected: $0 $*" >&2; exit 9 ;;
esac
"""


def test_here_publishes_and_slurm_sweeps_what_was_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sinfo", "scontrol"):
        (bin_dir / tool).write_text(SLURM_DOUBLE)
        os.chmod(bin_dir / tool, 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    pub = tmp_path / "pub"
    pub.mkdir()
    here = CliRunner().invoke(app, ["inspect", "--here", "--stack", "sandbox", "--no-record", "--format",
                                    "npd", "--fabric-if", "no-such-if", "--publish-dir", str(pub)],
                              env={"SLURMD_NODENAME": "gpu-0", "NODE_NAME": ""})
    assert f"published {pub}/inspect-gpu-0.json" in here.output, here.output
    res = CliRunner().invoke(app, ["inspect", "--slurm", "--stack", "sandbox", "--publish-dir", str(pub),
                                   "--history", str(tmp_path / "h"), "--format", "json"])
    assert res.exit_code == 1, res.output
    rows = {n["node"]: n for n in json.loads(res.output)["nodes"]}
    assert ("fabric-port-missing", "port no-such-if") in {(f["name"], f["subject"])
                                                            for f in rows["gpu-0"]["findings"]}
    assert rows["gpu-1"]["status"] == "unknown" and rows["gpu-1"]["unknown"][0] == NOT_PUBLISHED
    records = [json.loads(line) for line in (tmp_path / "h" / "sandbox.jsonl").read_text().splitlines()]
    assert {r["node"]: (r["observation"]["sched_state"], r["observation"]["job_exclusions"])
            for r in records} == {"gpu-0": ("idle", 0), "gpu-1": ("allocated", 1)}


def test_slurm_that_cannot_be_read_is_a_clear_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pub = tmp_path / "pub"
    pub.mkdir()
    argv = ["inspect", "--slurm", "--stack", "sandbox", "--publish-dir", str(pub), "--no-record"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sinfo anywhere
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and "sinfo: not found" in " ".join(res.output.split()), res.output
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\n"
                                   "exit 1\n")
    os.chmod(bin_dir / "sinfo", 0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # never this machine's own Slurm commands
    res = CliRunner().invoke(app, argv)
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "exit 1: sinfo: error: Unable to contact slurm controller" in out, out
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'login1|idle|none|Unknown|debug*|(null)'\n")
    res = CliRunner().invoke(app, argv)
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "no Slurm node belongs to a pool of stack sandbox (gpu)" in out, out
    (bin_dir / "sinfo").write_text(SLURM_DOUBLE)  # nodes of the pool, then scontrol, which is not there
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and "scontrol: not found" in " ".join(res.output.split()), res.output
