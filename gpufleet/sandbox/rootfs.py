"""A Debian root filesystem made by debootstrap from Debian's archive, once, as a tar file: the base
of the game-day CronJob's image (tools/image/gameday.py) and of the Kubernetes sandbox's kubelet node
image (gpufleet.sandbox.kube.node_image). No container registry is needed or reachable here.

Cached by its inputs in ${GPUFLEET_IMAGE_CACHE:-~/.cache/gpufleet/images}: both users ask for the
same suite, mirror and packages, so a machine debootstraps once for both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SUITE = "bookworm"  # Debian 12, as these machines; its python3 is 3.11 (pyproject: >=3.11)
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates")  # beyond debootstrap's minbase


class RootfsError(RuntimeError):
    """debootstrap or tar failed, or cannot run here; the message says which."""


def cache_dir() -> Path:
    configured = os.environ.get("GPUFLEET_IMAGE_CACHE", "")
    return Path(configured) if configured else Path.home() / ".cache" / "gpufleet" / "images"


def rootfs_key(suite: str = SUITE, mirror: str = MIRROR, packages: tuple[str, ...] = PACKAGES) -> str:
    """The cache key of a root filesystem (pure)."""
    return hashlib.sha256(json.dumps([suite, mirror, sorted(packages)]).encode()).hexdigest()[:12]


def rootfs_path() -> Path:
    return cache_dir() / f"rootfs-{SUITE}-{rootfs_key()}.tar"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        tail = "\n  | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise RootfsError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n  | {tail}")


def rootfs_tar(say: Callable[[str], None] = lambda _m: None) -> Path:
    """The Debian root filesystem as a tar file (numeric owners), made once per (suite, mirror,
    packages); needs root and debootstrap (Makefile APT_PACKAGES) the first time."""
    out = rootfs_path()
    if out.is_file():
        say(f"{out.name} cached")
        return out
    if shutil.which("debootstrap") is None:
        raise RootfsError("no debootstrap on PATH (Debian: apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise RootfsError("debootstrap needs root")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".rootfs.") as tmp:
        root = Path(tmp) / "rootfs"
        t = time.monotonic()
        include = f"--include={','.join(PACKAGES)}"
        _run(["debootstrap", "--variant=minbase", include, SUITE, str(root), MIRROR], "debootstrap")
        # Nothing an image needs: the package lists and downloaded archives.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], "tar of the rootfs")
        partial.replace(out)
        say(f"debootstrap {SUITE} in {time.monotonic() - t:.0f} s -> {out}")
    return out
