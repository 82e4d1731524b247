"""`nvidia-smi` queries a GPU host answers in CSV: per-GPU state and the row remapper's counts.

Field names are nvidia-smi's (`nvidia-smi --help-query-gpu`, `--help-query-remapped-rows`). A
value nvidia-smi cannot give ("[N/A]", "[Not Supported]") parses to None, never to 0: the caller
reports it as unknown.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from gpufleet.core.host import HostReadError, SmiGpu, int_value, number_value, run_tool, text_value
from gpufleet.core.host.kernel_log import normalize_pci

# pcie.link.gen.max, not .current: an idle GPU trains its link down to save power (measured and
# explained with lspci's LnkSta in baaz.dev, "Understanding Power Management in GPU via PCIe": Gen 1
# at idle on Gen 5 slots), so the current generation of an idle node reads low on healthy nodes.
# The max is the highest the GPU and this system's slot allow (nvidia-smi(1), "PCIe Generation"),
# which a wrong or badly trained slot lowers. The width is read as trained (.current).
GPU_QUERY = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total",
             "ecc.errors.corrected.volatile.total", "temperature.gpu", "pcie.link.gen.max",
             "pcie.link.width.current", "driver_version", "vbios_version")
# The row remapper (Ampere and later; NVIDIA "GPU Memory Error Management", User Visible Statistics:
# remapped rows correctable/uncorrectable, pending and failure flags).
REMAP_QUERY = ("gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable",
               "remapped_rows.pending", "remapped_rows.failure")
CSV_FORMAT = "--format=csv,noheader,nounits"


@dataclass(frozen=True)
class RemappedRows:
    pci: str
    correctable: float | None
    uncorrectable: float | None
    pending: float | None  # 1: a remap waits for the next GPU reset
    failure: float | None  # 1: a remap failed (the GPU needs service)


def _rows(text: str, width: int) -> list[list[str]]:
    return [r for r in csv.reader(text.splitlines(), skipinitialspace=True) if len(r) >= width]


def parse_query_gpu(text: str) -> list[SmiGpu]:
    """`nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits` -> one record per GPU.
    Lines that are not a GPU's (a warning nvidia-smi printed) are skipped."""
    out = []
    for r in _rows(text, len(GPU_QUERY)):
        if not r[0].strip().isdigit():
            continue
        try:
            pci = normalize_pci(r[1])
        except ValueError:
            continue
        out.append(SmiGpu(index=int(r[0]), pci=pci, ecc_uncorrected_volatile=number_value(r[2]),
                          ecc_corrected_volatile=number_value(r[3]), temperature_c=number_value(r[4]),
                          pcie_gen=int_value(r[5]), pcie_width=int_value(r[6]),
                          driver_version=text_value(r[7]), vbios_version=text_value(r[8])))
    return out


def parse_remapped_rows(text: str) -> list[RemappedRows]:
    """`nvidia-smi --query-remapped-rows=<REMAP_QUERY> --format=csv,noheader,nounits`."""
    out = []
    for r in _rows(text, len(REMAP_QUERY)):
        try:
            pci = normalize_pci(r[0])
        except ValueError:
            continue
        out.append(RemappedRows(pci, number_value(r[1]), number_value(r[2]), number_value(r[3]),
                                number_value(r[4])))
    return out


def query_gpus() -> list[SmiGpu]:
    text = run_tool(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", CSV_FORMAT])
    gpus = parse_query_gpu(text)
    if not gpus:
        raise HostReadError(f"nvidia-smi listed no GPU: {text.strip()[:200]!r}")
    return gpus


def query_remapped_rows() -> list[RemappedRows]:
    return parse_remapped_rows(run_tool(["nvidia-smi", f"--query-remapped-rows={','.join(REMAP_QUERY)}",
                                         CSV_FORMAT]))


# A reset bound of our own, not a vendor figure: a GPU reset takes seconds; 120 s leaves room for a
# GPU whose driver is slow to tear down, and bounds a hung one.
RESET_TIMEOUT_S = 120.0


def reset_gpu(pci: str) -> None:
    """`nvidia-smi --gpu-reset -i <pci>`: resets one GPU (root, and no process may hold it; the tool
    refuses otherwise). `-i` takes a PCI bus id as well as an index or UUID (nvidia-smi(1))."""
    run_tool(["nvidia-smi", "--gpu-reset", "-i", pci], timeout=RESET_TIMEOUT_S)
