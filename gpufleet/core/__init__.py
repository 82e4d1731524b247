"""The lowest layer: vocabulary shared by every domain (fault classes, the remediation ladder,
input errors). It imports nothing of ours."""

from gpufleet.core.errors import InputError, Problem, format_path
from gpufleet.core.taxonomy import FaultClass, LadderAction, Severity

__all__ = ["FaultClass", "InputError", "LadderAction", "Problem", "Severity", "format_path"]
