"""The real-node collector table is valid data with a source per entry, and the pure builders turn
it into exact argv per vendor, fabric and scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.errors import InputError
from gpufleet.fleet.bundle import realnode as R

WORK = Path("/tmp/work")


def facts(**kw: object) -> R.NodeFacts:
    base: dict[str, object] = dict(node="gpu-7", vendor="nvidia", fabric="infiniband", scheduler="slurm",
                                   since=1_765_000_000.9, workdir=WORK)
    return R.NodeFacts(**{**base, **kw})  # type: ignore[arg-type]


def by_name(planned: list[R.Planned]) -> dict[str, list[str]]:
    return {p.name: p.argv for p in planned}


def test_every_entry_has_a_source_and_unique_name() -> None:
    table = R.load_table()
    names = [e.name for s in R.Table.model_fields for e in getattr(table, s)]
    assert len(names) == len(set(names))
    assert all(len(e.source) > 20 for s in R.Table.model_fields for e in getattr(table, s))


def test_nvidia_infiniband_slurm_node() -> None:
    planned = R.plan(R.load_table(), facts())
    argv = by_name(planned)
    assert list(argv) == ["nvidia-bug-report", "dcgm-diag", "nvidia-smi-q", "ibstat", "iblinkinfo",
                          "journalctl-k", "dmesg", "slurmd-log", "scontrol-node", "dcgm-log",
                          "fabricmanager-log"]
    assert argv["nvidia-bug-report"] == ["nvidia-bug-report.sh", "--output-file",
                                         "/tmp/work/nvidia-bug-report.log"]
    assert planned[0].produces == Path("/tmp/work/nvidia-bug-report.log.gz")
    assert argv["dcgm-diag"] == ["dcgmi", "diag", "-r", "1", "-j"]
    assert argv["journalctl-k"] == ["journalctl", "-k", "--no-pager", "-o", "short-iso-precise",
                                    "--since", "@1765000000"]
    assert argv["scontrol-node"] == ["scontrol", "show", "node", "gpu-7"]


def test_ibdiagnet_only_when_asked_for() -> None:
    assert "ibdiagnet" not in by_name(R.plan(R.load_table(), facts()))
    argv = by_name(R.plan(R.load_table(), facts(), with_=["ibdiagnet"]))
    assert argv["ibdiagnet"] == ["ibdiagnet", "-o", "/tmp/work/ibdiagnet"]
    with pytest.raises(ValueError, match="--with nope: no such collector"):
        R.plan(R.load_table(), facts(), with_=["nope"])


def test_roce_repeats_ethtool_per_interface_and_kubernetes_reads_kubelet() -> None:
    planned = R.plan(R.load_table(), facts(vendor="amd", fabric="roce", scheduler="kueue",
                                           ifnames=("ens1f0", "ens2f0")))
    argv = by_name(planned)
    assert argv["ethtool-stats-ens1f0"] == ["ethtool", "-S", "ens1f0"]
    assert argv["ethtool-stats-ens2f0"] == ["ethtool", "-S", "ens2f0"]
    assert {p.member for p in planned if p.name.startswith("ethtool")} == {
        "fabric/ethtool-S-ens1f0.txt", "fabric/ethtool-S-ens2f0.txt"}
    assert argv["amd-smi-static"] == ["amd-smi", "static", "--json"]
    assert "kubelet-log" in argv and "slurmd-log" not in argv
    assert "dcgm-log" not in argv  # NVIDIA's agents only on NVIDIA nodes
    assert not any(n.startswith("nvidia") for n in argv)


def test_ascend_asks_each_npu_for_its_health() -> None:
    argv = by_name(R.plan(R.load_table(), facts(vendor="ascend", devices=(0, 1))))
    assert argv["npu-smi-info"] == ["npu-smi", "info"]
    assert argv["npu-smi-health-1"] == ["npu-smi", "info", "-t", "health", "-i", "1"]


def test_efa_has_no_fabric_section_yet() -> None:
    names = by_name(R.plan(R.load_table(), facts(fabric="efa")))
    assert not {"ibstat", "iblinkinfo", "ip-link"} & set(names)


def test_unknown_vendor_fabric_or_scheduler_is_refused_with_all_problems() -> None:
    with pytest.raises(ValueError) as e:
        R.sections(facts(vendor="intel", fabric="ethernet", scheduler="pbs"))
    msg = str(e.value)
    assert "vendor 'intel'" in msg and "fabric 'ethernet'" in msg and "scheduler 'pbs'" in msg


def test_a_bad_table_names_the_entry_and_what_is_wrong() -> None:
    text = R.TABLE.read_text().replace("[nvidia-smi, -q]", "[nvidia-smi, -q, \"{gpu}\"]")
    with pytest.raises(InputError) as e:
        R.parse_table(text, "realnode.yaml")
    assert e.value.file == "realnode.yaml"
    assert [p.path for p in e.value.problems] == ["nvidia[2]"]
    assert "unknown placeholder(s) ['gpu']" in e.value.problems[0].message
    with pytest.raises(InputError, match="not YAML"):
        R.parse_table("a: [", "x.yaml")
    per = "  - name: x\n    member: same.txt\n    per: ifname\n    argv: [a]\n    source: somewhere long\n"
    with pytest.raises(InputError, match=r"needs \{ifname\} in member"):
        R.parse_table(R.TABLE.read_text().replace("nvidia:\n", "nvidia:\n" + per, 1), "t.yaml")
