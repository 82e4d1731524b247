"""The real Kubernetes programs of the sandbox: their versions and where the built ones are.

tools/kube/build.py (`make kube-bins`) builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd, kwok and controller-gen from pinned Go modules, and generates the
operators' CRDs with controller-gen, into a cache keyed by versions (docs/kubernetes-sandbox.md,
ADR 0032). This package only reads tools/kube/versions.toml and computes paths; it runs nothing.
"""

from __future__ import annotations

from gpufleet.sandbox.kube.binaries import (
    BUILD_COMMAND,
    CACHE_ENV,
    KubeBinariesMissing,
    KubePaths,
    cache_root,
    kube_paths,
    missing_paths,
    require_kube_paths,
)
from gpufleet.sandbox.kube.versions import (
    Component,
    CrdSource,
    KubeVersions,
    gomod_problems,
    load_versions,
    parse_gomod,
    parse_versions,
)

__all__ = [
    "BUILD_COMMAND",
    "CACHE_ENV",
    "Component",
    "CrdSource",
    "KubeBinariesMissing",
    "KubePaths",
    "KubeVersions",
    "cache_root",
    "gomod_problems",
    "kube_paths",
    "load_versions",
    "missing_paths",
    "parse_gomod",
    "parse_versions",
    "require_kube_paths",
]
