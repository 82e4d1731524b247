"""The real-host inspect source (`gpufleet inspect --here`): what was read, or why not, becomes one
NodeObservation that the shared checks judge; the command end to end with an `nvidia-smi` test
double on PATH that prints what the real one prints for these queries; an AMD host read through an
`amd-smi` test double, and an Ascend host through an `npu-smi` one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.cli.main import app
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.host import SmiGpu
from gpufleet.core.host.kernel_log import XidSeen
from gpufleet.core.host.links import LinkReading
from gpufleet.core.host.nvidia_smi import RemappedRows
from gpufleet.fleet.inspect.checks import Context, Pins, check_node
from gpufleet.fleet.inspect.host import (
    HostReads,
    HostTarget,
    expected_ports,
    observation_from_host,
    read_host,
)
from gpufleet.fleet.inspect.observation import NodeObservation
from gpufleet.fleet.inspect.thresholds import load_thresholds

TARGET = HostTarget(node="gpu-a", pool="gpu", sku=AcceleratorModel.H100_SXM, expected_gpus=4,
                    expected_port_gbps=400.0, rails=2)


def smi(i: int, **kw: object) -> SmiGpu:
    base: dict[str, object] = dict(index=i, pci=f"0000:{0x18 + i:02x}:00", ecc_uncorrected_volatile=0.0,
                                   ecc_corrected_volatile=0.0, temperature_c=40.0, pcie_gen=5, pcie_width=16,
                                   driver_version="570.124.06", vbios_version="96.00.9F.00.04")
    return SmiGpu(**{**base, **kw})  # type: ignore[arg-type]


def remap(i: int, **kw: float) -> RemappedRows:
    return RemappedRows(f"0000:{0x18 + i:02x}:00", kw.get("c", 0.0), kw.get("u", 0.0), kw.get("p", 0.0),
                        kw.get("f", 0.0))


def ctx(pins: Pins = Pins("570.124.06", "96.00.9F.00.04")) -> Context:
    rules, _ = xid_policy(load_catalog(), {})
    return Context(thresholds=load_thresholds(), xid_rules=rules, pins=pins)


def ports(flaps: int = 0) -> list[LinkReading]:
    return [LinkReading("mlx5_0/1", True, "4: ACTIVE", 400.0, 2 * flaps),
            LinkReading("mlx5_1/1", True, "4: ACTIVE", 400.0, 0)]


def test_a_healthy_host_passes_every_check() -> None:
    reads = HostReads(gpus=[smi(i) for i in range(4)], remaps=[remap(i) for i in range(4)], xids=[],
                      ports=ports())
    o = observation_from_host(reads, TARGET, at=100.0)
    r = check_node(o, None, ctx(), run_full=False)
    assert (r.status, r.findings, r.unknown) == ("ok", (), ())
    assert (o.driver_version, o.firmware_version) == ("570.124.06", "96.00.9F.00.04")


def test_each_fault_of_a_host_is_its_code() -> None:
    reads = HostReads(
        gpus=[smi(0), smi(1, pcie_width=8), smi(2, ecc_corrected_volatile=5.0),
              smi(3, vbios_version="96.00.89.00.01")],
        remaps=[remap(0), remap(1, p=1.0), remap(2), remap(3, f=1.0)],
        xids=[XidSeen(None, 79, 90.0, "0000:1a:00"), XidSeen(None, 13, 91.0, "0000:99:00")],
        ports=[LinkReading("mlx5_0/1", False, "1: DOWN", None, 0), LinkReading("mlx5_1/1", True, "4: ACTIVE",
                                                                                 200.0, 0)])
    r = check_node(observation_from_host(reads, TARGET, at=100.0), None, ctx(), run_full=False)
    got = {(f.name, f.subject) for f in r.findings}
    assert {("gpu-xid", "GPU 2"),  # the XID line's PCI address names the GPU
            ("pcie-width-low", "GPU 1"), ("ecc-row-remap-pending", "GPU 1"),
            ("ecc-row-remap-failed", "GPU 3"),
            ("firmware-drift", "node"),  # GPUs that disagree drift from the pin
            ("fabric-port-down", "port mlx5_0/1"), ("fabric-port-slow", "port mlx5_1/1")} <= got
    assert r.status == "fail"
    # An XID on an address no GPU answers for is not pinned on a GPU (the count check sees a lost GPU).
    assert not any("XID 13" in f.detail for f in r.findings)


def test_what_could_not_be_read_is_unknown_never_healthy() -> None:
    reads = HostReads(gpus="nvidia-smi not found", remaps="nvidia-smi not found",
                      xids="dmesg exited 1: denied", ports=ports())
    r = check_node(observation_from_host(reads, TARGET, at=100.0), None, ctx(), run_full=False)
    assert r.status == "unknown"
    assert r.unknown[:2] == ("gpus: nvidia-smi not found", "driver: version not reported by the source")
    part = HostReads(gpus=[smi(0, ecc_uncorrected_volatile=None)], remaps="not supported",
                     xids="dmesg: denied", ports=[LinkReading("ens1", True, "up", 400.0, None)])
    o = observation_from_host(part, TARGET, at=100.0)
    na = HostReads(gpus=[smi(0)], remaps=[RemappedRows("0000:18:00", None, None, None, None)], xids=[],
                   ports=ports())
    assert observation_from_host(na, TARGET, at=100.0).unknown == (
        "ecc: GPU 0 reports no row-remapper counts ([N/A])",)
    assert set(o.unknown) == {"ecc: row remapper not read: not supported", "xid: dmesg: denied",
                              "ecc: GPU 0 reports no volatile ECC counts (is ECC off?)",
                              "fabric: port ens1 has no carrier counter (flaps not counted)"}


def test_flaps_count_between_two_runs_and_missing_rails_are_absent() -> None:
    before = observation_from_host(HostReads([smi(i) for i in range(4)], [remap(i) for i in range(4)], [],
                                             ports(0)), TARGET, at=100.0)
    after = observation_from_host(HostReads([smi(i) for i in range(4)], [remap(i) for i in range(4)], [],
                                            ports(4)), TARGET, at=200.0)
    r = check_node(after, before, ctx(), run_full=False)
    assert [(f.name, f.value) for f in r.findings] == [("fabric-port-flapping", 4)]
    only_one = expected_ports([LinkReading("mlx5_0/1", True, "4: ACTIVE", 400.0, 0)], rails=2)
    assert only_one[1] == LinkReading("rail-1", False, "absent")


SMI = """#!/bin/sh
# nvidia-smi's answers to the two queries gpufleet inspect --here asks (a test double).
case "$1" in
  --query-gpu=*) printf '%s\\n' \\
    "0, 00000000:18:00.0, 0, 0, 35, 5, 16, 550.90.07, 96.00.89.00.01" \\
    "1, 00000000:2A:00.0, 0, 0, 36, 5, 16, 550.90.07, 96.00.89.00.01" ;;
  --query-remapped-rows=*) printf '%s\\n' \\
    "00000000:18:00.0, 0, 0, 0, 0" "00000000:2A:00.0, 0, 1, 1, 0" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def test_the_command_reads_this_host_and_exits_with_the_node_code(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SMI)
    os.chmod(bin_dir / "nvidia-smi", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    klog = tmp_path / "kern.log"
    klog.write_text("2026-12-05T10:00:00+00:00 gpu-a kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, "
                    "GPU has fallen off the bus.\n")
    args = ["inspect", "--here", "--stack", "sandbox", "--node", "gpu-a", "--kernel-log", str(klog),
            "--history", str(tmp_path / "h")]
    res = CliRunner().invoke(app, [*args, "--format", "json", "--fabric-if", "no-such-if"])
    assert res.exit_code == 1, res.output
    node = json.loads(res.output)["nodes"][0]
    got = {(f["name"], f["subject"]) for f in node["findings"]}
    assert got == {("gpu-count-low", "node"), ("gpu-xid", "GPU 0"), ("ecc-row-remap-pending", "GPU 1"),
                   ("fabric-port-missing", "port no-such-if")}
    assert (tmp_path / "h" / "sandbox.jsonl").exists()  # recorded: the next run counts flaps from it
    npd = CliRunner().invoke(app, [*args, "--format", "npd", "--fabric-if", "no-such-if", "--no-record"])
    assert (npd.exit_code, npd.output.strip()) == (1, "PROBLEM: GFI001 gpu-count-low node (+3)")


def read_vendor_host(tmp_path: Path, bin_dir: Path, target: HostTarget, monkeypatch: pytest.MonkeyPatch,
                     kernel_line: str) -> NodeObservation:
    """Read a host whose vendor tool's test double is in `bin_dir`: one fabric port ens1 up at the
    stack's speed, a kernel log with one line and no XID."""
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    net = tmp_path / "net" / "ens1"
    net.mkdir(parents=True)
    mbps = str(int((target.expected_port_gbps or 0) * 1000))
    for name, value in (("operstate", "up"), ("speed", mbps), ("carrier_changes", "0")):
        (net / name).write_text(value + "\n")
    klog = tmp_path / "kern.log"
    klog.write_text(f"2026-12-05T10:00:00+00:00 {target.node} kernel: {kernel_line}\n")
    return observation_from_host(read_host(target, now=100.0, kernel_log=klog, fabric_ifs=["ens1"],
                                           net_root=tmp_path / "net", pci_root=tmp_path / "pci"),
                                 target, at=100.0)


AMD_SMI = """#!/bin/sh
# amd-smi's answers to the two queries gpufleet inspect --here asks on AMD (a test double).
here=$(dirname "$0")
case "$*" in
  "static --bus --vbios --driver --json") cat "$here/static.json" ;;
  "metric --ecc --pcie --json") cat "$here/ecc.json" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""
MI300X_BUSES = ("0c", "22", "38", "5c", "9f", "af", "bf", "df")
MI300X_VBIOS = "022.040.003.043.000001"


def test_an_amd_mi300x_host_is_read_through_amd_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Documents in the shape of the ROCm 6.2 CLI (gpufleet/core/host/amd_smi.py): 8 GPUs, GPU 3 with
    # 2 uncorrectable ECC errors, GPU 5 whose link trained to x8.
    static = [{"gpu": i, "bus": {"bdf": f"0000:{b}:00.0", "max_pcie_width": 16,
                                 "max_pcie_speed": {"value": 32, "unit": "GT/s"},
                                 "pcie_interface_version": "Gen 5", "slot_type": "OAM"},
               "vbios": {"name": "AMD MI300X", "build_date": "2024/05/10 10:00",
                         "part_number": "113-M3000100-102", "version": MI300X_VBIOS},
               "driver": {"name": "amdgpu", "version": "6.7.0"}} for i, b in enumerate(MI300X_BUSES)]
    ecc = [{"gpu": i, "ecc": {"total_correctable_count": 3 * i,
                              "total_uncorrectable_count": 2 if i == 3 else 0, "total_deferred_count": 0},
            "pcie": {"width": 8 if i == 5 else 16, "speed": {"value": 32, "unit": "GT/s"}}}
           for i in range(8)]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "amd-smi").write_text(AMD_SMI)
    os.chmod(bin_dir / "amd-smi", 0o755)
    (bin_dir / "static.json").write_text(json.dumps(static, indent=4))
    (bin_dir / "ecc.json").write_text(json.dumps(ecc, indent=4))
    target = HostTarget(node="mi-a", pool="gpu", sku=AcceleratorModel.MI300X, expected_gpus=8,
                        expected_port_gbps=400.0, rails=1)
    o = read_vendor_host(tmp_path, bin_dir, target, monkeypatch,
                         "amdgpu 0000:0c:00.0: SMU is initialized")
    assert o.gpus is not None and [g.index for g in o.gpus] == list(range(8))
    assert [g.ecc_correctable_volatile for g in o.gpus] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0]
    assert [g.ecc_uncorrectable_volatile for g in o.gpus] == [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    assert [(g.pcie_gen, g.pcie_width) for g in o.gpus] == [(5, 16)] * 5 + [(5, 8)] + [(5, 16)] * 2
    # No row remapper on AMD: 0, and no unknown line for it; AMD has no XIDs.
    assert all((g.row_remap_pending, g.row_remap_failed, g.uncorrectable_remapped_rows, g.xids)
               == (0.0, 0.0, 0.0, ()) for g in o.gpus)
    assert (o.driver_version, o.firmware_version) == ("6.7.0", MI300X_VBIOS)
    assert o.unknown == ()  # in particular no "no host reader for amd GPUs"
    r = check_node(o, None, ctx(Pins("6.7.0", MI300X_VBIOS)), run_full=False)
    assert {(f.name, f.subject) for f in r.findings} == {("ecc-uncorrectable", "GPU 3"),
                                                         ("pcie-width-low", "GPU 5")}
    assert r.status == "fail"


NPU_SMI = """#!/bin/sh
# npu-smi's answers to the queries gpufleet inspect --here asks on Ascend (a test double).
here=$(dirname "$0")
case "$*" in
  "info -l") cat "$here/list.txt" ;;
  "info -t board -i "*) cat "$here/board-$5.txt" ;;
  "info -t ecc -i "*) cat "$here/ecc-$5.txt" ;;
  "info -t ecc-enable -i "*) cat "$here/ecc-enable-$5.txt" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""
ASCEND_BUSES = ("C1", "01", "41", "81", "C2", "02", "42", "82")
ASCEND_FW = "7.5.0.1.129"


def npu_lines(width: int, *fields: tuple[str, object]) -> str:
    """Lines as npu-smi prints them: a tab, the field padded to `width`, " : ", the value."""
    return "".join(f"\t{k:<{width}} : {v}\n" for k, v in fields)


def test_an_ascend_910b_host_is_read_through_npu_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Answers in the form of npu-smi's source on a 910B server (gpufleet/core/host/npu_smi.py): 8 NPUs,
    # NPU 2 with one HBM double-bit (uncorrectable) error, NPU 6 with 12,000 single-bit ones.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(NPU_SMI)
    os.chmod(bin_dir / "npu-smi", 0o755)
    listing = npu_lines(30, ("Total Count", 8)) + "\n"
    for i, bus in enumerate(ASCEND_BUSES):
        listing += npu_lines(30, ("NPU ID", i), ("Chip Count", 1)) + "\n"
        (bin_dir / f"board-{i}.txt").write_text(npu_lines(
            30, ("NPU ID", i), ("Product Name", "NA"), ("Model", "NA"), ("Manufacturer", "Huawei"),
            ("Serial Number", f"10231234567{i}"), ("Software Version", "24.1.rc2"),
            ("Firmware Version", ASCEND_FW), ("Compatibility", "OK"), ("Board ID", "0x33"), ("PCB ID", "A"),
            ("BOM ID", 1), ("PCIe Bus Info", f"0000:{bus}:00.0"), ("Slot ID", i), ("Class ID", "NA"),
            ("Chip Count", 1)))
        single, double = (12000 if i == 6 else 0), (1 if i == 2 else 0)
        (bin_dir / f"ecc-{i}.txt").write_text(
            npu_lines(40, ("NPU ID", i), ("Chip Count", 1)) + "\n" + npu_lines(
                40, ("HBM Single Bit Error Count", single), ("HBM Double Bit Error Count", double),
                ("HBM Single Bit Aggregate Total Err Cnt", single),
                ("HBM Double Bit Aggregate Total Err Cnt", double),
                ("HBM Single Bit Isolated Pages Count", 0), ("HBM Double Bit Isolated Pages Count", 0),
                ("HBM Single Bit Next-Isolated Pages Count", 0),
                ("HBM Double Bit Next-Isolated Pages Count", double), ("Chip ID", 0)) + "\n")
        (bin_dir / f"ecc-enable-{i}.txt").write_text(npu_lines(30, ("HBM ECC-Enable Status", "True")))
    (bin_dir / "list.txt").write_text(listing)
    # The kernel's view of each NPU's link (sysfs, as Documentation/ABI/testing/sysfs-bus-pci names
    # the files): x16 at up to 32 GT/s, but NPU 5 trained to x8; NPU 7 has no PCI device directory.
    for i, bus in enumerate(ASCEND_BUSES[:7]):
        dev = tmp_path / "pci" / f"0000:{bus.lower()}:00.0"
        dev.mkdir(parents=True)
        for name, value in (("current_link_width", 8 if i == 5 else 16), ("max_link_width", 16),
                            ("current_link_speed", "2.5 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe")):
            (dev / name).write_text(f"{value}\n")
    target = HostTarget(node="npu-a", pool="npu", sku=AcceleratorModel.ASCEND_910B, expected_gpus=8,
                        expected_port_gbps=200.0, rails=1)
    o = read_vendor_host(tmp_path, bin_dir, target, monkeypatch, "drv_devmng: device 0 is ready")
    assert o.gpus is not None and [g.index for g in o.gpus] == list(range(8))
    assert [g.ecc_uncorrectable_volatile for g in o.gpus] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [g.ecc_correctable_volatile for g in o.gpus] == [0.0] * 6 + [12000.0, 0.0]
    # npu-smi prints no PCIe link state: the kernel's is read instead (generation: the device's
    # capability, as an idle link trains its speed down); NPU 7's stays unknown.
    assert [(g.pcie_gen, g.pcie_width, g.pcie_width_max) for g in o.gpus] == (
        [(5, 16, 16)] * 5 + [(5, 8, 16), (5, 16, 16), (None, None, None)])
    # No row remapper on Ascend: 0, and no unknown line for it; Ascend has no XIDs.
    assert all((g.row_remap_pending, g.row_remap_failed, g.uncorrectable_remapped_rows, g.xids)
               == (0.0, 0.0, 0.0, ()) for g in o.gpus)
    assert (o.driver_version, o.firmware_version) == ("24.1.rc2", ASCEND_FW)
    assert o.unknown == ()  # in particular no "no host reader for ascend NPUs"
    r = check_node(o, None, ctx(Pins("24.1.rc2", ASCEND_FW)), run_full=False)
    # No PCIe pin for the 910B: NPU 5's x8 is judged against the x16 it reports it supports.
    assert {(f.name, f.subject) for f in r.findings} == {("ecc-uncorrectable", "GPU 2"),
                                                         ("ecc-correctable-high", "GPU 6"),
                                                         ("pcie-width-low", "GPU 5")}
    detail = next(f.detail for f in r.findings if f.name == "pcie-width-low")
    assert detail == "PCIe x8, the device supports x16"
    assert r.status == "fail"


@pytest.mark.parametrize(("argv", "says"), [
    (["--here", "--level", "full"], "--here runs the light checks"),
    (["--fabric-if", "fab0"], "give --here"),
    (["--here", "--pool", "nope"], "no node pool 'nope'"),
    (["--here", "--kernel-log", "/no/such/log"], "/no/such/log: not a file"),
])
def test_bad_here_input_exits_2(argv: list[str], says: str) -> None:
    res = CliRunner().invoke(app, ["inspect", "--stack", "sandbox", "--no-record", *argv])
    # Whitespace normalized: the runner wraps a long message at its terminal width.
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output


def test_a_full_kubernetes_sweep_without_a_perf_pod_exits_2_before_reading_it(tmp_path: Path) -> None:
    # No Kubernetes sandbox of this stack under the state root, and the stack sets no inspect.perfPod.
    res = CliRunner().invoke(app, ["inspect", "--stack", "sandbox", "--kubernetes", "--level", "full",
                                   "--no-record"], env={"GPUFLEET_SANDBOX_ROOT": str(tmp_path)})
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "stack sandbox sets no inspect.perfPod" in out, res.output
    res = CliRunner().invoke(app, ["inspect", "--stack", "sandbox", "--kubernetes", "--here"])
    assert res.exit_code == 2 and "not with --here" in " ".join(res.output.split()), res.output
