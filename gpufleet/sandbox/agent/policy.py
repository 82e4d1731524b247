"""Which injected values are GPU faults, and which of them are fatal to the process using the GPU.

"Fatal" comes from the catalog and the stack's XID overrides, never from a list here: a fault is
fatal when its action isolates the node (reset-gpu and above on the ladder) or when DCGM's health
watch reports FAIL for it (gpu-faults.md: XIDs 48, 74, 79, 95, 119, 120, 140 are always FAIL). XIDs
neither the catalog nor the stack knows are reported but not fatal.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufleet.catalog import Catalog, Fault, XidRule
from gpufleet.catalog.model import HealthCheck
from gpufleet.catalog.policy import ISOLATING_CLASSES
from gpufleet.core.taxonomy import LadderAction
from gpufleet.sandbox.agent import fields as F

# CUDA runtime error strings (cudaGetErrorString) a process sees when its GPU fails this way.
_LAUNCH_FAILURE = "unspecified launch failure"  # cudaErrorLaunchFailure (719)
_ECC = "uncorrectable ECC error encountered"  # cudaErrorECCUncorrectable (214)
_ILLEGAL_ADDRESS = "an illegal memory access was encountered"  # cudaErrorIllegalAddress (700)

_XID_CUDA_ERROR = {31: _ILLEGAL_ADDRESS, 48: _ECC, 63: _ECC, 64: _ECC, 94: _ECC, 95: _ECC}
_ECC_FIELDS = {
    F.ECC_SBE_VOL_TOTAL, F.ECC_DBE_VOL_TOTAL, F.ECC_DBE_AGG_TOTAL, F.UNCORRECTABLE_REMAPPED_ROWS,
    F.CORRECTABLE_REMAPPED_ROWS, F.ROW_REMAP_FAILURE, F.ROW_REMAP_PENDING,
}
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}


@dataclass(frozen=True)
class GpuFault:
    """A fault the agent holds for one GPU until it is cleared (GPU reset / node reboot)."""

    fatal: bool
    fault_id: str | None
    xid: int | None
    title: str
    error: str  # what a CUDA process on this GPU fails with
    # The process using the GPU at the time dies even though the GPU stays usable: an application
    # error or a contained ECC error (XID 13, 31, 43, 94; action restart-job) terminates the
    # application that hit it, and a restarted one runs (NVIDIA XID catalog: "restart the app").
    kills_process: bool = False


def is_fatal(fault: Fault) -> bool:
    return fault.action.isolates_node or fault.dcgm_health == "FAIL"


def kills_process(fault: Fault) -> bool:
    """The catalog says the job must restart (restart-job or above on the ladder)."""
    return is_fatal(fault) or fault.action.rank >= LadderAction.RESTART_JOB.rank


def classify_xid(xid: int, catalog: Catalog, rules: Mapping[int, XidRule]) -> GpuFault:
    """What an XID does to the GPU, by the stack's XID policy (the catalog with the stack's
    remediation.xidOverrides applied, gpufleet.catalog.xid_policy): an override that makes an XID
    isolate the node makes it fatal here too."""
    rule = rules.get(xid)
    fault = catalog.get(rule.fault_id) if rule is not None and rule.fault_id else None
    title = fault.title if fault else f"Xid {xid}"
    cuda = _XID_CUDA_ERROR.get(xid, _LAUNCH_FAILURE)
    fatal = rule is not None and (
        rule.fault_class in ISOLATING_CLASSES
        or rule.action.isolates_node
        or (fault is not None and fault.dcgm_health == "FAIL")
    )
    return GpuFault(
        fatal=fatal,
        fault_id=rule.fault_id if rule else None,
        xid=xid,
        title=title,
        error=f"CUDA error: {cuda} (Xid {xid}: {title})",
        kills_process=fatal or (rule is not None and rule.action.rank >= LadderAction.RESTART_JOB.rank),
    )


def _worst_match(catalog: Catalog, value: float, reads: Callable[[HealthCheck], bool]) -> Fault | None:
    """The catalog fault whose health check reads this series (`reads`) and matches `value`; of
    several, the one highest on the remediation ladder."""
    matches = [
        f for f in catalog
        if f.health_check is not None and reads(f.health_check) and f.health_check.threshold is not None
        and _OPS[f.health_check.op](value, f.health_check.threshold)
    ]
    return max(matches, key=lambda f: (is_fatal(f), f.action.rank)) if matches else None


def classify_field(field_id: int, value: float, catalog: Catalog) -> GpuFault | None:
    """The catalog fault a non-XID field value matches (its `dcgm-field` health check), if any.

    When several match, the one highest on the remediation ladder wins."""
    fault = _worst_match(catalog, value, lambda hc: hc.source == "dcgm-field" and hc.field_id == field_id)
    if fault is None:
        return None
    cuda = _ECC if field_id in _ECC_FIELDS else _LAUNCH_FAILURE
    metric = F.FIELDS[field_id].metric if field_id in F.FIELDS else f"field {field_id}"
    return GpuFault(
        fatal=is_fatal(fault),
        fault_id=fault.id,
        xid=fault.xid,
        title=fault.title,
        error=f"CUDA error: {cuda} ({fault.title}: {metric}={value:g})",
        kills_process=kills_process(fault),
    )


def classify_metric(metric: str, value: float, catalog: Catalog) -> GpuFault | None:
    """The catalog fault a vendor exporter's series value matches (its `exporter-field` health
    check), if any; as classify_field, the highest on the ladder wins."""
    fault = _worst_match(catalog, value, lambda hc: hc.source == "exporter-field" and hc.metric == metric)
    if fault is None:
        return None
    # What the vendor's runtime returns to the process (HIP's hipErrorECCNotCorrectable, ACL's
    # device error) is not modelled per vendor: the rank fails with the fault named.
    what = "uncorrectable ECC error" if "ecc" in metric else "device error"
    return GpuFault(
        fatal=is_fatal(fault),
        fault_id=fault.id,
        xid=None,
        title=fault.title,
        error=f"{what} ({fault.title}: {metric}={value:g})",
        kills_process=kills_process(fault),
    )


def worse(a: GpuFault | None, b: GpuFault | None) -> GpuFault | None:
    """The fault to keep when a GPU already holds `a` and `b` arrives: a fatal fault is never
    replaced by a non-fatal one (an XID 45 after an XID 79 leaves the GPU dead); otherwise the
    newer one is kept."""
    if a is None:
        return b
    if b is None:
        return a
    if a.fatal and not b.fatal:
        return a
    if a.fatal and b.fatal:
        return a  # the first fatal fault is what broke the GPU
    return b
