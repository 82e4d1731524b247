"""`gpufleet gpu-reset`: reset NVIDIA GPUs and record each reset in the kernel log (ADR 0079).

A GPU reset leaves no line in the kernel log of its own, so a reader of the log alone (node-health's
HealthCheckProgram, `gpufleet inspect --here`, the Kubernetes publisher) would keep counting the XIDs
that the reset remedied until the next reboot. The mark written here dates the reset for them. With
`--mark-only` the reset was done by another tool (by hand with nvidia-smi, a GPU reset job) and only
the mark is written. A mark is written only after nvidia-smi said the reset succeeded."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.errors import InputError, Problem
from gpufleet.core.host import HostReadError
from gpufleet.core.host.kernel_log import normalize_pci, write_reset_mark
from gpufleet.core.host.nvidia_smi import reset_gpu


@dataclass(frozen=True)
class ResetOutcome:
    pci: str
    reset: bool  # nvidia-smi reset it (or --mark-only: another tool did)
    error: str | None = None  # None: reset and recorded


def check_inputs(pcis: Sequence[str], kmsg: Path) -> list[str]:
    """The PCI addresses, normalized; InputError naming each bad one and an unwritable log."""
    problems, out = [], []
    for i, text in enumerate(pcis):
        try:
            out.append(normalize_pci(text))
        except ValueError:
            problems.append(Problem(f"PCI[{i}]", f"not a PCI address: {text!r} (e.g. 0000:18:00.0)"))
    if not pcis:
        problems.append(Problem("PCI", "name at least one GPU by its PCI address"))
    if len(set(out)) != len(out):
        problems.append(Problem("PCI", "a GPU is named twice"))
    target = kmsg if kmsg.exists() else kmsg.parent
    if not os.access(target, os.W_OK):
        problems.append(Problem("--kmsg", f"{kmsg}: not writable here (the mark needs root on /dev/kmsg)"))
    if problems:
        raise InputError("gpufleet gpu-reset", problems)
    return out


def reset_and_mark(pcis: Sequence[str], kmsg: Path, *, mark_only: bool,
                   reset: Callable[[str], None] = reset_gpu) -> list[ResetOutcome]:
    """Reset each GPU in turn, then mark it; a GPU whose reset failed gets no mark."""
    out = []
    for pci in pcis:
        if not mark_only:
            try:
                reset(pci)
            except HostReadError as e:
                out.append(ResetOutcome(pci, False, str(e)))
                continue
        try:
            write_reset_mark(pci, kmsg)
        except OSError as e:
            out.append(ResetOutcome(pci, True, f"{kmsg}: {e.strerror}"))
            continue
        out.append(ResetOutcome(pci, True))
    return out
