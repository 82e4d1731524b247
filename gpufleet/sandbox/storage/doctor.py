"""`gpufleet sandbox doctor --storage`: what this machine lacks for the storage sandbox.

The Ceph programs come from Debian 12's packages; the code is written against Ceph 16 (Pacific),
the release Debian 12 ships, so another major release is reported (its options and defaults
differ: a newer radosgw accepts the checksums that 16 refuses, for one).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

from gpufleet.sandbox.doctor import Check, apt_line

# Executable -> the Debian package that ships it (Debian 12).
STORAGE_BINARIES: dict[str, str] = {
    "ceph-mon": "ceph-mon",
    "ceph-mgr": "ceph-mgr",
    "ceph-osd": "ceph-osd",
    "radosgw": "radosgw",
    "radosgw-admin": "radosgw",
    "ceph": "ceph-common",
    "monmaptool": "ceph-base",
    # Its monitoring (gpufleet.sandbox.storage.monitoring, ADR 0049).
    "prometheus": "prometheus",
    "prometheus-blackbox-exporter": "prometheus-blackbox-exporter",
}
CEPH_MAJOR = 16  # Pacific, Debian 12's ceph (16.2.15+ds-0+deb12u*)

_VERSION = re.compile(r"ceph version (\d+)\.(\d+)\.(\d+)")


def ceph_major(version_text: str) -> int | None:
    m = _VERSION.search(version_text)
    return int(m[1]) if m else None


def diagnose_storage(
    which: Callable[[str], str | None] = shutil.which,
    version: Callable[[], str] | None = None,
) -> list[Check]:
    missing: dict[str, list[str]] = {}
    for binary, pkg in STORAGE_BINARIES.items():
        if which(binary) is None:
            missing.setdefault(pkg, []).append(binary)
    if missing:
        return [
            Check(f"package {pkg}", False, f"missing executable(s): {', '.join(bins)}", apt_line([pkg]))
            for pkg, bins in sorted(missing.items())
        ]
    checks = [
        Check("storage packages", True, "all present: " + ", ".join(sorted(set(STORAGE_BINARIES.values()))))
    ]
    text = (version or _ceph_version)()
    major = ceph_major(text)
    checks.append(
        Check(
            "ceph version",
            major == CEPH_MAJOR,
            text.strip() or "`ceph --version` printed nothing",
            ""
            if major == CEPH_MAJOR
            else f"the storage sandbox is written for Ceph {CEPH_MAJOR} (Debian 12's)",
        )
    )
    return checks


def _ceph_version() -> str:
    try:
        return subprocess.run(["ceph", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ceph --version` failed: {e}"
