"""Where the built Kubernetes programs and generated CRDs are: pure paths, and a check.

tools/kube/build.py (`make kube-bins`) builds them from pinned Go modules into a cache keyed by
versions (ADR 0032):

    ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}/<component>-<version>/bin/<program>
    ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}/crds/<source>-<version>/*.yaml

`kube_paths` computes those paths from the versions and a cache root and touches nothing;
`require_kube_paths` also checks that they are there and, where not, names each missing one and the
command that builds it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.sandbox.kube.versions import (
    KUBE_GROUP,
    VERSIONS_FILE,
    Component,
    CrdSource,
    KubeVersions,
    load_versions,
)

CACHE_ENV = "GPUFLEET_GO_CACHE"
BUILD_COMMAND = "make kube-bins"
STAMP = ".stamp.json"  # written last by build.py: a directory without it is not a finished build
# A CRD source with `rbac` in versions.toml also gets its controller's ClusterRole, generated from its
# +kubebuilder:rbac markers, in <crds>/<source>-<version>/rbac/role.yaml (not applied as a CRD).
RBAC_DIR = "rbac"
RBAC_FILE = "role.yaml"


def cache_root(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """$GPUFLEET_GO_CACHE, else ~/.cache/gpufleet/go (an empty value counts as unset)."""
    env = os.environ if env is None else env
    configured = env.get(CACHE_ENV, "")
    if configured:
        return Path(configured).expanduser().absolute()
    return (home if home is not None else Path.home()) / ".cache" / "gpufleet" / "go"


def component_dir(root: Path, component: Component) -> Path:
    return root / f"{component.name}-{component.version}"


def crd_dir(root: Path, source: CrdSource) -> Path:
    return root / "crds" / f"{source.name}-{source.version}"


@dataclass(frozen=True)
class KubePaths:
    """Absolute paths of every program (by program name) and of each CRD source's folder."""

    binaries: Mapping[str, Path]
    crds: Mapping[str, Path]

    def as_json(self) -> dict[str, object]:
        """What `build.py --print-paths` prints: {program: path, ..., "crds": {source: folder}}."""
        out: dict[str, object] = {name: str(path) for name, path in sorted(self.binaries.items())}
        out["crds"] = {name: str(path) for name, path in sorted(self.crds.items())}
        return out

    def rbac_file(self, source: str) -> Path:
        """The ClusterRole controller-gen generated for a CRD source's controller (`rbac`)."""
        return self.crds[source] / RBAC_DIR / RBAC_FILE

    def crd_files(self) -> list[Path]:
        """Every generated CRD file, sorted (for `kubectl apply -f` one by one)."""
        return sorted(p for d in self.crds.values() for p in d.glob("*.yaml"))


def kube_paths(versions: KubeVersions, root: Path) -> KubePaths:
    """Pure: where build.py puts each program and each CRD source for these versions (the `kube`
    group only: the Pulumi CLI's programs are gpufleet.sandbox.pulumi_cli's, `make pulumi-bins`)."""
    binaries = {
        program: component_dir(root, comp) / "bin" / program
        for comp in versions.in_group(KUBE_GROUP)
        for program in comp.binaries
    }
    return KubePaths(binaries, {src.name: crd_dir(root, src) for src in versions.crds})


class KubeBinariesMissing(RuntimeError):
    """Some programs or CRDs are not built; the message names each and the command to run."""

    def __init__(self, missing: list[tuple[str, Path]]) -> None:
        self.missing = missing
        lines = [f"  {name}: {path}" for name, path in missing]
        super().__init__(
            f"{len(missing)} Kubernetes program(s) or CRD set(s) not built:\n"
            + "\n".join(lines)
            + f"\nRun `{BUILD_COMMAND}` (tools/kube/build.py; it builds them from the versions in "
            f"{VERSIONS_FILE.relative_to(VERSIONS_FILE.parents[2])})."
        )


def missing_paths(paths: KubePaths) -> list[tuple[str, Path]]:
    """(name, path) of each program that is not an executable file and each unfinished CRD folder."""
    out = [
        (name, path)
        for name, path in sorted(paths.binaries.items())
        if not (path.is_file() and os.access(path, os.X_OK))
    ]
    out += [
        (f"crds/{name}", path) for name, path in sorted(paths.crds.items()) if not (path / STAMP).is_file()
    ]
    return out


def require_kube_paths(
    versions: KubeVersions | None = None, root: Path | None = None, unused: frozenset[str] = frozenset()
) -> KubePaths:
    """The paths, once every program and CRD set is there (but the programs in `unused`, which
    the caller will not start); else KubeBinariesMissing."""
    versions = load_versions() if versions is None else versions
    paths = kube_paths(versions, cache_root() if root is None else root)
    missing = [(name, path) for name, path in missing_paths(paths) if name not in unused]
    if missing:
        raise KubeBinariesMissing(missing)
    return paths
