"""`amd-smi` (ROCm's AMD SMI CLI) queries an AMD GPU host answers in JSON: each GPU's PCI address,
maximum PCIe generation, VBIOS/IFWI and driver versions (`static`), its ECC totals and its current
PCIe link width (`metric --ecc --pcie`).

Field names are amd-smi's own, read in its source (never run here: these machines have no AMD GPU):
- [6.2] ROCm/amdsmi at tag rocm-6.2.0: amdsmi_cli/amdsmi_commands.py (static_gpu, metric_gpu) and
  amdsmi_cli/amdsmi_logger.py (the JSON document), src/amd_smi/amd_smi.cc (where values come from);
- [new] the CLI since moved to ROCm/rocm-systems, projects/amdsmi/amdsmi_cli/: subcommands/static.py
  (commit 027a4605), subcommands/metric.py (commit 133c4fc1), amdsmi_logger.py (commit 04076a24).
Where the versions differ, both shapes are read:
- the document is a list of per-GPU objects ([6.2] `_print_json_output`), or that list under
  "gpu_data" ([new] `combine_arrays_to_json`);
- the firmware section is "vbios" ([6.2]) or "ifwi" ([new]; ROCm 7.1.0 changelog, AMD SMI 26.1.0:
  `static --vbios` became `--ifwi`; the ROCm 10.1.0 changelog: `--vbios` remains a legacy alias, so
  it is what we pass, which [6.2] also knows);
- a value with a unit is {"value": x, "unit": "..."} in JSON output, a plain number where it has none;
- a value amd-smi cannot give is the string "N/A": None here, never 0 (the caller reports it unknown).
Not read: `amd-smi bad-pages` (retired pages are not remapped rows; gpufleet.fleet.inspect.host says why).
"""

from __future__ import annotations

import dataclasses
import json
import re

from gpufleet.core.host import HostReadError, SmiGpu, number_value, run_tool, text_value
from gpufleet.core.host.kernel_log import normalize_pci

STATIC_ARGS = ("amd-smi", "static", "--bus", "--vbios", "--driver", "--json")
METRIC_ARGS = ("amd-smi", "metric", "--ecc", "--pcie", "--json")

# Transfer rate (GT/s) of each PCIe generation (PCI-SIG base specifications; the same table maps
# max_pcie_speed to pcie_interface_version in [6.2] amd_smi.cc amdsmi_get_pcie_info).
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_GEN = re.compile(r"Gen\s*(\d+)")


def _bare(v: object) -> object:
    """A JSON value without its unit: {"value": 32, "unit": "GT/s"} -> 32."""
    return v.get("value") if isinstance(v, dict) else v


def _number(v: object) -> float | None:
    v = _bare(v)
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    return number_value(v) if isinstance(v, str) else None


def _positive_int(v: object) -> int | None:
    n = _number(v)
    return int(n) if n is not None and n > 0 else None


def _text(v: object) -> str | None:
    v = _bare(v)
    return text_value(v) if isinstance(v, str) else None


def _section(rec: dict[str, object], *keys: str) -> dict[str, object]:
    """The first of `keys` that holds an object ("N/A" when amd-smi could not read the section)."""
    for k in keys:
        v = rec.get(k)
        if isinstance(v, dict):
            return v
    return {}


def _records(text: str, what: str) -> list[tuple[int, dict[str, object]]]:
    """(index, object) of each GPU in one `--json` answer; "gpu" is the index amd-smi lists it by."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise HostReadError(f"{what}: not JSON: {text.strip()[:200]!r}") from None
    if isinstance(doc, dict):
        doc = doc.get("gpu_data")
    if not isinstance(doc, list):
        raise HostReadError(f"{what}: no list of GPUs: {text.strip()[:200]!r}")
    return [(i, r) for r in doc if isinstance(r, dict) and isinstance(i := r.get("gpu"), int)
            and not isinstance(i, bool)]


def _pcie_gen(bus: dict[str, object]) -> int | None:
    m = _GEN.fullmatch(_text(bus.get("pcie_interface_version")) or "")
    if m:
        return int(m[1])
    speed = _number(bus.get("max_pcie_speed"))
    return None if speed is None else _GEN_BY_GTS.get(speed)


def _gpu(index: int, rec: dict[str, object]) -> SmiGpu | None:
    # [6.2] static_gpu / [new] static.py: "bus" holds "bdf", "max_pcie_width", "max_pcie_speed"
    # ({"value": 32, "unit": "GT/s"}) and "pcie_interface_version" ("Gen 5"). The generation is the
    # maximum, not the current speed (metric --pcie "speed"): an idle GPU trains its link speed down
    # to save power (see nvidia_smi.GPU_QUERY), so the current speed reads low on healthy idle nodes.
    # [6.2] amd_smi.cc reads the maximum from sysfs max_link_speed, what the GPU's own link can do
    # (the Linux PCI core's LnkCap), so unlike nvidia-smi's pcie.link.gen.max it does not see a slot
    # that trained the link slower. The width is the current one, as nvidia-smi's
    # pcie.link.width.current (with_metric): a link trained narrower is what the check is for.
    bus = _section(rec, "bus")
    try:
        pci = normalize_pci(_text(bus.get("bdf")) or "")
    except ValueError:
        return None  # as nvidia_smi.parse_query_gpu: a GPU without an address is not listed
    # [6.2] "vbios" / [new] "ifwi": "name", "build_date", "part_number", "version" ([6.2]
    # py-interface/amdsmi_interface.py amdsmi_get_gpu_vbios_info); "version" stands for nvidia-smi's
    # vbios_version.
    firmware = _section(rec, "ifwi", "vbios")
    # "driver": "name", "version" ([6.2] from driver_version; [new] from driver_full_version).
    driver = _section(rec, "driver")
    return SmiGpu(index=index, pci=pci, ecc_uncorrected_volatile=None, ecc_corrected_volatile=None,
                  temperature_c=None, pcie_gen=_pcie_gen(bus), pcie_width=None,
                  driver_version=_text(driver.get("version")), vbios_version=_text(firmware.get("version")))


def parse_static(text: str) -> list[SmiGpu]:
    """`amd-smi static --bus --vbios --driver --json` -> one record per GPU, ECC not yet read (None)."""
    return [g for i, r in _records(text, "amd-smi static") if (g := _gpu(i, r)) is not None]


@dataclasses.dataclass(frozen=True)
class AmdMetric:
    """What `amd-smi metric --ecc --pcie` says of one GPU (None: it could not say)."""

    ecc_uncorrectable: float | None
    ecc_correctable: float | None
    pcie_width: int | None


def parse_metric(text: str) -> dict[int, AmdMetric]:
    """`amd-smi metric --ecc --pcie --json` -> GPU index: its ECC totals and current link width.

    [6.2] metric_gpu / [new] metric.py: "ecc" holds "total_correctable_count",
    "total_uncorrectable_count" (also deferred and cache counts, not read). They are the sums, over
    the RAS blocks the driver has enabled, of the driver's per-block error counts ([6.2] amd_smi.cc
    amdsmi_get_gpu_total_ecc_count); "N/A" when the library could not read them. With no RAS block
    enabled the sums are 0, not "N/A": the CLI does not tell ECC off from no errors.
    "pcie" holds "width" (the current lane count, from the library's pcie_metric.pcie_width), with
    "speed", "bandwidth" and the replay and NAK counters (not read)."""
    out: dict[int, AmdMetric] = {}
    for i, r in _records(text, "amd-smi metric"):
        ecc, pcie = _section(r, "ecc"), _section(r, "pcie")
        out[i] = AmdMetric(_number(ecc.get("total_uncorrectable_count")),
                           _number(ecc.get("total_correctable_count")), _positive_int(pcie.get("width")))
    return out


def with_metric(gpus: list[SmiGpu], metric: dict[int, AmdMetric]) -> list[SmiGpu]:
    """The static records with their ECC totals and link width; a GPU the metric answer does not
    list keeps None (unknown)."""
    out = []
    for g in gpus:
        m = metric.get(g.index, AmdMetric(None, None, None))
        out.append(dataclasses.replace(g, ecc_uncorrected_volatile=m.ecc_uncorrectable,
                                       ecc_corrected_volatile=m.ecc_correctable, pcie_width=m.pcie_width))
    return out


def query_gpus() -> list[SmiGpu]:
    text = run_tool(STATIC_ARGS)
    gpus = parse_static(text)
    if not gpus:
        raise HostReadError(f"amd-smi listed no GPU: {text.strip()[:200]!r}")
    return with_metric(gpus, parse_metric(run_tool(METRIC_ARGS)))
