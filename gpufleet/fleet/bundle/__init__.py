"""Diagnostic bundles (issue 16): when a fault is detected, before remediation touches the node, one
tar.gz of what an engineer or a vendor asks for, with a manifest (name, size, sha256, collector,
command, exit status, duration, truncation), bounded in time and size (docs/diagnostic-bundles.md)."""

from gpufleet.fleet.bundle.archive import BundleError, read_manifest, verify, write_bundle
from gpufleet.fleet.bundle.caps import REAL_NODE_CAPS, SANDBOX_CAPS
from gpufleet.fleet.bundle.model import Caps, Manifest, Member
from gpufleet.fleet.bundle.service import BundleInputError, collect_real, collect_sandbox, load_sandbox

__all__ = [
    "REAL_NODE_CAPS", "SANDBOX_CAPS", "BundleError", "BundleInputError", "Caps", "Manifest", "Member",
    "collect_real", "collect_sandbox", "load_sandbox", "read_manifest", "verify", "write_bundle",
]
