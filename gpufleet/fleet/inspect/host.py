"""The inspect source of a real GPU host: `gpufleet inspect --here` reads the host it runs on, as
Slurm's HealthCheckProgram or a node-problem-detector plugin would run it (docs/fleet-inspect.md).

- GPUs: on NVIDIA, `nvidia-smi --query-gpu` (count, volatile ECC, PCIe link, driver and VBIOS
  versions) and `--query-remapped-rows` (the row remapper), from gpufleet.core.host.nvidia_smi; on AMD,
  `amd-smi static --bus --vbios --driver` and `amd-smi metric --ecc --pcie` (JSON: count, ECC
  totals, PCIe link, driver and VBIOS/IFWI versions), from gpufleet.core.host.amd_smi; on Ascend,
  `npu-smi info -l` and per NPU `info -t board`, `-t ecc`, `-t ecc-enable` (count, HBM ECC counts,
  driver and firmware versions; no PCIe link), from gpufleet.core.host.npu_smi;
- each device's PCIe link from sysfs (gpufleet.core.host.pci_link): the lanes it supports on every
  vendor, and the link itself where the SMI tool prints none (Ascend);
- XIDs: the kernel log since each GPU's last reset recorded in it, or since boot (`dmesg`, or a log
  file), mapped to GPUs by PCI address;
- fabric ports: HCA ports in /sys/class/infiniband, or the named interfaces in /sys/class/net.

`read_host` does the reading (thin I/O); `observation_from_host` (pure) turns what was read, or why
it could not be, into the NodeObservation every check takes. Anything unread is UNKNOWN, never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.config.accelerators import AcceleratorModel, Vendor, accelerator_spec
from gpufleet.core.host import HostReadError, SmiGpu, amd_smi, npu_smi, nvidia_smi
from gpufleet.core.host.kernel_log import XidSeen, read_dmesg, read_kernel_log
from gpufleet.core.host.links import SYS_CLASS_IB, SYS_CLASS_NET, LinkReading, read_ib_ports, read_net_links
from gpufleet.core.host.nvidia_smi import RemappedRows
from gpufleet.core.host.pci_link import SYS_BUS_PCI, PciLink, read_pci_link
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs


@dataclass(frozen=True)
class HostReads:
    """What each reader returned, or why it could not read (a str). `remaps` None: the GPUs have no
    row remapper to read (AMD, Ascend)."""

    gpus: list[SmiGpu] | str
    remaps: list[RemappedRows] | str | None
    xids: list[XidSeen] | str
    ports: list[LinkReading] | str


@dataclass(frozen=True)
class HostTarget:
    """What the stack expects of this host."""

    node: str
    pool: str
    sku: AcceleratorModel
    expected_gpus: int
    expected_port_gbps: float | None
    rails: int  # the fabric's railsPerNode: HCA ports a node must show when the stack names no HCAs


def _versions(values: Sequence[str | None]) -> str | None:
    """One version for the node; GPUs that disagree read as all of them (which drifts from any pin)."""
    seen = sorted({v for v in values if v is not None})
    return ",".join(seen) if seen else None


def _gpus(reads: HostReads, unknown: list[str]) -> tuple[GpuObs, ...] | None:
    if isinstance(reads.gpus, str):
        unknown.append(f"gpus: {reads.gpus}")
        return None
    remap_by_pci: dict[str, RemappedRows] = {}
    if isinstance(reads.remaps, str):
        unknown.append(f"ecc: row remapper not read: {reads.remaps}")
    elif reads.remaps is not None:
        remap_by_pci = {r.pci: r for r in reads.remaps}
    xids: dict[int, list[int]] = {}
    if isinstance(reads.xids, str):
        unknown.append(f"xid: {reads.xids}")
    else:
        index_by_pci = {g.pci: g.index for g in reads.gpus}
        for x in reads.xids:
            idx = index_by_pci.get(x.pci or "")
            if idx is not None:
                xids.setdefault(idx, []).append(x.xid)
    out = []
    for g in sorted(reads.gpus, key=lambda g: g.index):
        if g.ecc_uncorrected_volatile is None or g.ecc_corrected_volatile is None:
            unknown.append(f"ecc: GPU {g.index} reports no volatile ECC counts (is ECC off?)")
        r = remap_by_pci.get(g.pci)
        if r is None and isinstance(reads.remaps, list):
            unknown.append(f"ecc: GPU {g.index} has no row-remapper counts")
        elif r is not None and None in (r.uncorrectable, r.failure, r.pending):
            unknown.append(f"ecc: GPU {g.index} reports no row-remapper counts ([N/A])")
        out.append(GpuObs(
            index=g.index, xids=tuple(xids.get(g.index, ())),
            ecc_correctable_volatile=g.ecc_corrected_volatile or 0.0,
            ecc_uncorrectable_volatile=g.ecc_uncorrected_volatile or 0.0,
            uncorrectable_remapped_rows=(r.uncorrectable or 0.0) if r else 0.0,
            row_remap_failed=(r.failure or 0.0) if r else 0.0,
            row_remap_pending=(r.pending or 0.0) if r else 0.0,
            pcie_gen=g.pcie_gen, pcie_width=g.pcie_width, pcie_width_max=g.pcie_width_max,
        ))
    return tuple(out)


def _ports(reads: HostReads, unknown: list[str]) -> tuple[PortObs, ...] | None:
    if isinstance(reads.ports, str):
        unknown.append(f"fabric: {reads.ports}")
        return None
    out = []
    for link in reads.ports:
        if link.state == "absent":
            out.append(PortObs(name=link.name, state="absent"))
            continue
        if link.carrier_changes is None:
            unknown.append(f"fabric: port {link.name} has no carrier counter (flaps not counted)")
        out.append(PortObs(name=link.name, state="up" if link.up else "down", speed_gbps=link.speed_gbps,
                           carrier_changes=link.carrier_changes or 0))
    return tuple(out)


def observation_from_host(reads: HostReads, target: HostTarget, *, at: float) -> NodeObservation:
    unknown: list[str] = []
    gpus = _gpus(reads, unknown)
    ports = _ports(reads, unknown)
    smi = reads.gpus if isinstance(reads.gpus, list) else []
    return NodeObservation(
        node=target.node, pool=target.pool, sku=target.sku, at=at, expected_gpus=target.expected_gpus,
        gpus=gpus, ports=ports, expected_port_gbps=target.expected_port_gbps,
        driver_version=_versions([g.driver_version for g in smi]),
        firmware_version=_versions([g.vbios_version for g in smi]),
        # The scheduler's view is left unknown: `--here` runs the light checks, which need none.
        unknown=tuple(unknown),
    )


def expected_ports(found: list[LinkReading], rails: int) -> list[LinkReading]:
    """HCA ports found when the stack names no HCAs: fewer than the rails are absent ports."""
    missing = [LinkReading(f"rail-{i}", False, "absent") for i in range(len(found), rails)]
    return [*found, *missing]


def with_pci_link(g: SmiGpu, link: PciLink | None) -> SmiGpu:
    """The SMI tool's reading, with what the kernel's PCI core says of the device's link where the tool
    said nothing (npu-smi prints no link) and the lanes the device supports (pure)."""
    if link is None:
        return g
    return dataclasses.replace(
        g, pcie_width=g.pcie_width if g.pcie_width is not None else link.width,
        pcie_gen=g.pcie_gen if g.pcie_gen is not None else link.max_gen, pcie_width_max=link.max_width)


def read_host(target: HostTarget, *, now: float, kernel_log: Path | None = None,
              fabric_ifs: Sequence[str] = (), hcas: Sequence[str] | None = None,
              net_root: Path = SYS_CLASS_NET, ib_root: Path = SYS_CLASS_IB,
              pci_root: Path = SYS_BUS_PCI) -> HostReads:
    """Read this host. `fabric_ifs`: Ethernet interfaces to read instead of the HCA ports (a RoCE
    node's netdevs, a sandbox node's fab0); `hcas`: the stack's HCA names (fabric.hcas)."""
    vendor = accelerator_spec(target.sku).vendor
    gpus: list[SmiGpu] | str
    remaps: list[RemappedRows] | str | None
    if vendor is Vendor.NVIDIA:
        try:
            gpus = nvidia_smi.query_gpus()
        except HostReadError as e:
            gpus = str(e)
        try:
            remaps = nvidia_smi.query_remapped_rows()
        except HostReadError as e:
            remaps = str(e)
    elif vendor is Vendor.AMD:
        try:
            gpus = amd_smi.query_gpus()
        except HostReadError as e:
            gpus = str(e)
        # No row remapper on AMD: the row-remap fields stay 0 and no unknown line is added. AMD reports
        # retired pages, not remapped rows: `amd-smi bad-pages` lists retired, pending-retirement and
        # unreservable pages (amdsmi_cli/amdsmi_parser.py at ROCm/amdsmi rocm-6.2.0, the help of
        # --retired, --pending, --un-res). A retired page is memory the driver takes out of use, not a
        # DRAM row replaced by a spare one, and the AMD documents read define no state that matches
        # NVIDIA's "remap pending" (applied at the next reset) or "remap failed" (no spare row left);
        # mapping pages onto the row-remap checks would be a made-up equivalence. Not read here.
        remaps = None
    else:  # Vendor.HUAWEI: Ascend NPUs
        try:
            gpus = npu_smi.query_gpus()
        except HostReadError as e:
            gpus = str(e)
        # No row remapper on Ascend either: the row-remap fields stay 0 and no unknown line is added.
        # npu-smi's ECC answer counts isolated HBM pages and pages to be isolated, the latter applied
        # after the NPU is reset or the system restarts (docs/en/Ascend_950_npu-smi/.../
        # querying-the-ecc-error-count-of-a-device.md in CANN's driver repository, copy
        # verylucky01/driver at e29d066f). That is page retirement, as AMD's retired pages above, not a
        # DRAM row replaced by a spare; no Huawei document read defines a "remap failed" state or a row
        # count. Mapping pages onto the row-remap checks would be a made-up equivalence. Not read here.
        remaps = None
    if isinstance(gpus, list):
        gpus = [with_pci_link(g, read_pci_link(g.pci, pci_root)) for g in gpus]
    pci_map = {g.pci: g.index for g in gpus} if isinstance(gpus, list) else {}
    xids: list[XidSeen] | str
    try:
        log = read_kernel_log(kernel_log, pci_map, now) if kernel_log else read_dmesg(pci_map, now)
        xids = list(log.current)  # a GPU reset recorded in the log ends what came before it
    except HostReadError as e:
        xids = str(e)
    ports: list[LinkReading] | str
    if fabric_ifs:
        ports = read_net_links(fabric_ifs, net_root)
    elif hcas:
        ports = read_ib_ports(ib_root, hcas)
    else:
        ports = expected_ports(read_ib_ports(ib_root), target.rails)
    return HostReads(gpus=gpus, remaps=remaps, xids=xids, ports=ports)
