"""`gpufleet sandbox doctor`: what this machine lacks for the sandbox, and how to get it.

Each check says exactly what is missing (not root, a Debian package, a kernel feature, a Python
package) and the command that fixes it. Kernel features are probed for real inside a throw-away
network namespace that the doctor creates and deletes.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

# Executable -> Debian package that ships it (Debian 12).
BINARIES: dict[str, str] = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "srun": "slurm-client",
    "munged": "munge",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "ip": "iproute2",
    "tc": "iproute2",
    "nft": "nftables",
    "unshare": "util-linux",
    "hostname": "hostname",
    "haproxy": "haproxy",  # the serving workload's balancer (stack sandbox.serving)
}

# Kernel feature -> the kernel config options behind it (what to ask for on a custom kernel).
KERNEL_FEATURES: dict[str, str] = {
    "netns": "CONFIG_NET_NS",
    "veth": "CONFIG_VETH",
    "bridge": "CONFIG_BRIDGE",
    "tbf": "CONFIG_NET_SCH_TBF",
    "nftables": "CONFIG_NF_TABLES, CONFIG_NFT_NUMGEN",
    "uts-namespace": "CONFIG_UTS_NS",
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def apt_line(packages: list[str]) -> str:
    pkgs = " ".join(sorted(set(packages)))
    return (
        f"apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {pkgs}"
    )


def missing_packages(which: Callable[[str], str | None] = shutil.which) -> dict[str, list[str]]:
    """Debian package -> its executables not found on PATH (plus /usr/sbin, /sbin)."""
    out: dict[str, list[str]] = {}
    for binary, pkg in BINARIES.items():
        if which(binary) is None:
            out.setdefault(pkg, []).append(binary)
    return out


def package_checks(missing: dict[str, list[str]]) -> list[Check]:
    if not missing:
        return [Check("debian packages", True, "all present: " + ", ".join(sorted(set(BINARIES.values()))))]
    return [
        Check(
            f"package {pkg}",
            False,
            f"missing executable(s): {', '.join(bins)}",
            apt_line([pkg]),
        )
        for pkg, bins in sorted(missing.items())
    ] + [Check("all missing packages", False, "install them in one go", apt_line(list(missing)))]


def kernel_fix(feature: str) -> str:
    return (
        f"the running kernel lacks {feature} ({KERNEL_FEATURES[feature]}): use a kernel built with it "
        "(Debian's stock kernel has it; inside a container, run it privileged on such a host)"
    )


def _run(argv: list[str]) -> tuple[bool, str]:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return res.returncode == 0, (res.stderr or res.stdout).strip()


def probe_kernel() -> list[Check]:
    """Create a namespace and try each feature in it; everything is removed afterwards."""
    if shutil.which("ip") is None:
        return [
            Check(f"kernel {f}", False, "cannot probe: `ip` (iproute2) is missing", apt_line(["iproute2"]))
            for f in KERNEL_FEATURES
        ]
    ns = f"gfdoctor-{secrets.token_hex(3)}"
    checks: list[Check] = []
    ok, err = _run(["ip", "netns", "add", ns])
    checks.append(
        Check("kernel netns", ok, "network namespaces work" if ok else err, "" if ok else kernel_fix("netns"))
    )
    if not ok:
        return checks
    try:
        probes: list[tuple[str, str, list[str]]] = [  # (feature, tool it needs, argv)
            ("veth", "ip", ["ip", "-n", ns, "link", "add", "gfdv0", "type", "veth", "peer", "name", "gfdv1"]),
            ("bridge", "ip", ["ip", "-n", ns, "link", "add", "gfdbr", "type", "bridge"]),
            (
                "tbf",
                "tc",
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "gfdv0",
                    "root",
                    "tbf",
                    "rate",
                    "1mbit",
                    "burst",
                    "32kbit",
                    "latency",
                    "400ms",
                ],
            ),
            (
                "nftables",
                "nft",
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "nft",
                    "add table inet gfdoctor; "
                    "add chain inet gfdoctor input { type filter hook input priority 0; }; "
                    "add rule inet gfdoctor input numgen random mod 10 0 drop",
                ],
            ),
            ("uts-namespace", "unshare", ["unshare", "--uts", "true"]),
        ]
        for feature, tool, argv in probes:
            if shutil.which(tool) is None:
                checks.append(
                    Check(
                        f"kernel {feature}",
                        False,
                        f"cannot probe: `{tool}` is missing",
                        apt_line([BINARIES[tool]]),
                    )
                )
                continue
            ok, err = _run(argv)
            checks.append(
                Check(f"kernel {feature}", ok, "works" if ok else err, "" if ok else kernel_fix(feature))
            )
    finally:
        _run(["ip", "netns", "del", ns])
    return checks


def python_checks() -> list[Check]:
    out = []
    for mod, pip in (
        ("torch", "torch==2.13.0"),
        ("pyroute2", "pyroute2"),
        ("prometheus_client", "prometheus-client"),
        ("locust", "locust"),  # the serving load (gpufleet.chaos.serving)
    ):
        ok = importlib.util.find_spec(mod) is not None
        out.append(
            Check(
                f"python {mod}",
                ok,
                "importable" if ok else "not installed",
                "" if ok else f".venv/bin/pip install '{pip}'  (or: make venv)",
            )
        )
    return out


def root_check(euid: int) -> Check:
    if euid == 0:
        return Check("root", True, "running as root")
    return Check(
        "root",
        False,
        f"running as uid {euid}; namespaces, links and Slurm daemons need root",
        "run as root: sudo .venv/bin/gpufleet sandbox up",
    )


def kube_binary_checks(missing: list[tuple[str, str]], build_command: str) -> list[Check]:
    """One check per Kubernetes program or CRD set that is not built, each fixed by the build."""
    if not missing:
        return [Check("kubernetes programs", True, "kube-apiserver, etcd, kwok, ... and the CRDs are built")]
    return [Check(f"kubernetes {name}", False, f"not built: {path}", build_command) for name, path in missing]


def kube_python_checks() -> list[Check]:
    out = []
    for mod, pip in (("cryptography", "cryptography"), ("httpx", "httpx"), ("kubernetes", "kubernetes")):
        ok = importlib.util.find_spec(mod) is not None
        out.append(
            Check(
                f"python {mod}",
                ok,
                "importable" if ok else "not installed",
                "" if ok else f".venv/bin/pip install '{pip}'  (or: make venv)",
            )
        )
    return out


def diagnose_kube() -> list[Check]:
    """What `gpufleet sandbox up --kubernetes` needs: the programs built from the pinned Go modules
    (`make kube-bins`) and three Python packages. No root: its daemons listen on loopback only."""
    from gpufleet.sandbox.kube.binaries import BUILD_COMMAND, cache_root, kube_paths, missing_paths
    from gpufleet.sandbox.kube.versions import load_versions

    missing = missing_paths(kube_paths(load_versions(), cache_root()))
    return kube_binary_checks([(n, str(p)) for n, p in missing], BUILD_COMMAND) + kube_python_checks()


def diagnose() -> list[Check]:
    checks = [root_check(os.geteuid())]
    checks += package_checks(missing_packages())
    if os.geteuid() == 0:
        checks += probe_kernel()
    else:
        checks.append(
            Check("kernel features", False, "not probed: probing needs root", "run the doctor as root")
        )
    checks += python_checks()
    return checks
