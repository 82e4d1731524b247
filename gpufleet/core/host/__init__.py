"""Reading a GPU host's own state: the kernel log's XID lines, `nvidia-smi`, `amd-smi`, `npu-smi`, and
the fabric ports in sysfs. Shared by node health (gpufleet.health) and fleet inspection
(gpufleet.fleet.inspect), which are sibling layers, so the readers live here once. Pure parsers beside
thin readers; a reader that cannot read raises HostReadError with why, and its caller reports that as
UNKNOWN, never healthy.

Here: what the vendor readers share (the per-GPU record, the tool runner, "could not read" markers).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

CMD_TIMEOUT_S = 10.0


class HostReadError(Exception):
    """A host source could not be read; the message says which and why."""


def run_tool(argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S) -> str:
    """Run a host tool found on PATH and return its stdout; HostReadError when it is missing,
    hangs past `timeout` or exits non-zero (with the start of what it printed)."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise HostReadError(f"{argv[0]} not found")
    try:
        res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostReadError(f"{argv[0]}: no answer in {timeout:g} s") from None
    except OSError as e:
        raise HostReadError(f"{argv[0]}: {e.strerror}") from None
    if res.returncode != 0:
        said = (res.stderr or res.stdout).strip()[:200]
        raise HostReadError(f"{argv[0]} exited {res.returncode}: {said}")
    return res.stdout


@dataclass(frozen=True)
class SmiGpu:
    """One GPU (or Ascend NPU) as its vendor's SMI tool reports it (nvidia_smi, amd_smi, npu_smi
    query_gpus). None: the tool did not give the value (the caller reports it as unknown, never as 0)."""

    index: int
    pci: str  # normalized (kernel_log.normalize_pci), the form XID lines carry
    ecc_uncorrected_volatile: float | None
    ecc_corrected_volatile: float | None
    temperature_c: float | None
    pcie_gen: int | None
    pcie_width: int | None
    driver_version: str | None
    vbios_version: str | None  # NVIDIA's VBIOS; AMD's VBIOS/IFWI version; Ascend's NPU firmware version
    pcie_width_max: int | None = None  # lanes the device supports (sysfs max_link_width; pci_link)


# What the SMI tools print for a value they cannot give: nvidia-smi "[N/A]", "[Not Supported]" (CSV);
# amd-smi "N/A" (its JSON and text output, e.g. amdsmi_cli/amdsmi_commands.py at ROCm/amdsmi rocm-6.2.0);
# npu-smi "NA" (its source, e.g. npucli/src/npu_card_info.c and npu_info_print.c; npu_smi says where).
_NOT_GIVEN = ("N/A", "Not Supported", "NA")


def text_value(text: str) -> str | None:
    """A tool's value as text; None for empty or a could-not-read marker."""
    t = text.strip()
    return None if not t or t.startswith("[") or t in _NOT_GIVEN else t


def number_value(text: str) -> float | None:
    """A tool's value as a number; None for a could-not-read marker or text that is not a number."""
    t = text_value(text)
    if t is None:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def int_value(text: str) -> int | None:
    v = number_value(text)
    return None if v is None else int(v)
