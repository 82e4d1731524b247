"""`npu-smi` (Huawei Ascend's NPU management CLI) queries an Ascend host answers in text: the NPUs
(`info -l`), each NPU's PCI address, driver and firmware versions (`info -t board -i N`), its HBM ECC
counts (`info -t ecc -i N`) and whether HBM ECC is on (`info -t ecc-enable -i N`).

Every line read is `<field padded> : <value>` (printf "\\t%-30s : %s" or "%-40s" for ECC), as npu-smi's
own source prints it (never run here: these machines have no NPU). Sources:
- [src] npu-smi's source, CANN's open-source driver repository (README: "the CANN driver module"), read
  in its GitHub copy verylucky01/driver at commit e29d066fd6ee84cae705e2000a0387d721d3aaa0, directory
  src/custom/dev_prod/user/npucli/: src/npu_info.c, src/npu_card_info.c, src/npu_chip_info.c,
  src/npu_info_print.c (its ORIENT_CH variant, src/npu_info_print_ch.c, prints the same fields read
  here; CMakeLists.txt builds the NPU_SMI_V2 layout for ascend950 alone, not for 910B);
- [dcmi] the same commit, docs/zh/Ascend_910B_DCMI_API/Ascend_910B_DCMI_API/dcmi_get_device_ecc_info.md
  (the library call behind both ECC commands, for Atlas 800T A2 / 900 A2 PoD and other 910B products);
- [doc950] the same commit, docs/en/Ascend_950_npu-smi/Ascend_950_npu-smi/
  querying-the-ecc-error-count-of-a-device.md (what each ECC line counts).
A value npu-smi cannot give prints "NA" ([src] npu_card_info.c npu_get_card_version_info sets the
firmware version to "NA" until it is read): None here, never 0 (the caller reports it unknown).

Not given by npu-smi, so None: the PCIe link width and generation. npu-smi reads LnkCap/LnkSta only to
classify links for `info -t topo` ([src] npu_info.c topo_get_pcie_cfg_info_by_pcie_id) and prints
neither. Temperature is not read (as on AMD; no check uses it).
"""

from __future__ import annotations

import dataclasses

from gpufleet.core.host import HostReadError, SmiGpu, int_value, number_value, run_tool, text_value
from gpufleet.core.host.kernel_log import normalize_pci

LIST_ARGS = ("npu-smi", "info", "-l")


def board_args(npu: int) -> tuple[str, ...]:
    return ("npu-smi", "info", "-t", "board", "-i", str(npu))


def ecc_args(npu: int) -> tuple[str, ...]:
    return ("npu-smi", "info", "-t", "ecc", "-i", str(npu))


def ecc_enable_args(npu: int) -> tuple[str, ...]:
    return ("npu-smi", "info", "-t", "ecc-enable", "-i", str(npu))


def _fields(text: str) -> list[tuple[str, str]]:
    """(field, value) of each `field : value` line, in order (a field repeats once per NPU or chip).
    Split at the first colon: no field name has one, a value may ("PCIe Bus Info : 0000:61:00.0")."""
    out = []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.append((name.strip(), value.strip()))
    return out


def parse_list(text: str) -> list[int]:
    """`npu-smi info -l` -> the NPU IDs, the `-i` of every other query.

    [src] npu_info.c query_all_info -> npu_info_print.c print_all_info: "Total Count" (or "Card
    Count"), then per NPU "NPU ID" and "Chip Count" ("Product Name" and "Serial Number" too on other
    than 910/910B servers); "There is no NPU card on this server." when there is none."""
    ids = [int_value(v) for k, v in _fields(text) if k == "NPU ID"]
    return [i for i in ids if i is not None]


@dataclasses.dataclass(frozen=True)
class NpuBoard:
    """What `npu-smi info -t board -i N` says of one NPU (None: it could not say)."""

    pci: str | None  # normalized (kernel_log.normalize_pci)
    driver_version: str | None
    firmware_version: str | None


def parse_board(text: str) -> NpuBoard:
    """`npu-smi info -t board -i N` on a 910/910B/910_93 server ([src] npu_card_info.c
    show_ascend_card_board_info -> show_ascend_board_info -> npu_info_print.c print_ascend_board_info):
    "NPU ID", "Product Name", "Model", "Manufacturer", "Serial Number" (910B and later), "Software
    Version", "Firmware Version", "Compatibility", "Board ID", "PCB ID", "BOM ID", "PCIe Bus Info",
    "Slot ID", "Class ID", PCI vendor/device IDs, "Chip Count". Another board (a PCIe card) prints the
    same three fields (print_npu_card_info).
    - "Software Version": the driver's version (npu_get_card_version_info: dcmi_get_driver_version);
    - "Firmware Version": chip 0's firmware, on 910B its HILINK component (npu_chip_info.c
      npu_get_npu_firmware_version); "NA" when not readable (e.g. not permitted);
    - "PCIe Bus Info": domain:bus:device.function, "%04X:%02X:%02X.%X" (print_card_pcie_info); "NA" on
      boards without PCIe (A900 A5 UB, print_card_ub_info)."""
    f = dict(_fields(text))
    try:
        pci: str | None = normalize_pci(text_value(f.get("PCIe Bus Info", "")) or "")
    except ValueError:
        pci = None
    return NpuBoard(pci, text_value(f.get("Software Version", "")), text_value(f.get("Firmware Version", "")))


@dataclasses.dataclass(frozen=True)
class NpuEcc:
    """HBM ECC counts of one NPU, summed over its chips (None: npu-smi printed none)."""

    uncorrectable: float | None
    correctable: float | None


def parse_ecc(text: str) -> NpuEcc:
    """`npu-smi info -t ecc -i N` -> the NPU's current HBM single- and double-bit error counts.

    [src] npu_card_info.c show_ascend_card_ecc_info -> show_ascend_card_info: "NPU ID", "Chip Count",
    then per chip the ECC lines and "Chip ID". Per chip (npu_chip_info.c show_ascend_chip_ecc_info):
    DDR lines on 910 and 310P only (show_ddr_ecc_info prints none on 910B), then on 910/910B/910_93
    (show_hbm_ecc_info -> npu_info_print.c printf_hbm_ecc_info) "HBM Single Bit Error Count", "HBM
    Double Bit Error Count", the lifetime "HBM ... Aggregate Total Err Cnt", "HBM ... Isolated Pages
    Count" and, on 910B, "HBM ... Next-Isolated Pages Count".
    The first two are dcmi_ecc_info's single_bit_error_cnt / double_bit_error_cnt: [dcmi] current
    counts, cleared when the system restarts (the lifetime totals are not), so they stand for
    nvidia-smi's volatile corrected / uncorrected counts; [dcmi] a multi-bit error needs locating and
    handling. Only HBM is read (the NPU's device memory; [doc950] "on-chip memory"). A card listing
    several chips per NPU ID has its chips' counts summed (not met on 910B: Chip Count 1)."""
    single = [number_value(v) for k, v in _fields(text) if k == "HBM Single Bit Error Count"]
    double = [number_value(v) for k, v in _fields(text) if k == "HBM Double Bit Error Count"]

    def total(vs: list[float | None]) -> float | None:
        return None if not vs or None in vs else sum(v for v in vs if v is not None)

    return NpuEcc(uncorrectable=total(double), correctable=total(single))


def parse_ecc_enabled(text: str) -> bool | None:
    """`npu-smi info -t ecc-enable -i N` -> whether HBM ECC detection is on; None: not said.

    [src] npu_card_info.c show_ascend_card_ecc_enable: "HBM ECC-Enable Status" is "True" or "False"
    on 910/910B/910_93, from the same dcmi_get_device_ecc_info call as the counts ([dcmi] enable_flag
    0: ECC detection off). With detection off the counts print as numbers all the same, so they are
    only taken when this says True."""
    status = dict(_fields(text)).get("HBM ECC-Enable Status")
    return {"True": True, "False": False}.get(status or "")


def npu_record(index: int, board: NpuBoard, ecc: NpuEcc, ecc_enabled: bool | None) -> SmiGpu | None:
    """One NPU as the shared record; None when it has no PCI address (as nvidia_smi / amd_smi, an
    accelerator without an address is not listed: XID lines and counts are matched by address)."""
    if board.pci is None:
        return None
    on = ecc_enabled is True
    return SmiGpu(index=index, pci=board.pci,
                  ecc_uncorrected_volatile=ecc.uncorrectable if on else None,
                  ecc_corrected_volatile=ecc.correctable if on else None,
                  temperature_c=None, pcie_gen=None, pcie_width=None,
                  driver_version=board.driver_version, vbios_version=board.firmware_version)


def query_gpus() -> list[SmiGpu]:
    """Every NPU `npu-smi info -l` lists, three queries each. npu-smi exits with its command's return
    code ([src] npu_smi.c main), so a query it cannot answer is a HostReadError (run_tool)."""
    text = run_tool(LIST_ARGS)
    ids = parse_list(text)
    if not ids:
        raise HostReadError(f"npu-smi listed no NPU: {text.strip()[:200]!r}")
    out = []
    for i in ids:
        board = parse_board(run_tool(board_args(i)))
        ecc = parse_ecc(run_tool(ecc_args(i)))
        rec = npu_record(i, board, ecc, parse_ecc_enabled(run_tool(ecc_enable_args(i))))
        if rec is not None:
            out.append(rec)
    return out
