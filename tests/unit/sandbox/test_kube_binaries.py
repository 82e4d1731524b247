"""Versions and paths of the sandbox's Kubernetes programs (gpufleet.sandbox.kube); no Go needed."""

from __future__ import annotations

import copy
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpufleet.core.errors import InputError
from gpufleet.infra.charts import CHARTS
from gpufleet.sandbox.kube import (
    BUILD_COMMAND,
    KubeBinariesMissing,
    cache_root,
    gomod_problems,
    kube_paths,
    load_versions,
    missing_paths,
    parse_gomod,
    parse_versions,
    require_kube_paths,
)
from gpufleet.sandbox.kube.binaries import STAMP
from gpufleet.sandbox.kube.versions import TOOLS_DIR, VERSIONS_FILE

MINIMAL: dict[str, Any] = {
    "components": {
        "kubernetes": {
            "module": "k8s.io/kubernetes",
            "version": "v1.37.2",
            "staging_version": "v0.37.2",
            "dir": "kubernetes",
            "binaries": {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            },
            "stamp": {"k8s.io/component-base/version.gitVersion": "{version}", "x.gitMinor": "{minor}"},
        },
        "etcd": {
            "module": "go.etcd.io/etcd/server/v3",
            "version": "v3.7.3",
            "dir": "etcd",
            "binaries": {"etcd": "go.etcd.io/etcd/server/v3"},
        },
    },
    "crds": {
        "kueue": {
            "module": "sigs.k8s.io/kueue",
            "version": "v0.12.3",
            "chart": "kueue",
            "packages": ["./apis/kueue/v1beta1"],
            "options": "crd:maxDescLen=0",
        }
    },
}


def test_paths_are_keyed_by_component_and_version() -> None:
    v = parse_versions(MINIMAL)
    paths = kube_paths(v, Path("/cache"))
    assert paths.binaries == {
        "kube-apiserver": Path("/cache/kubernetes-v1.37.2/bin/kube-apiserver"),
        "kubectl": Path("/cache/kubernetes-v1.37.2/bin/kubectl"),
        "etcd": Path("/cache/etcd-v3.7.3/bin/etcd"),
    }
    assert paths.crds == {"kueue": Path("/cache/crds/kueue-v0.12.3")}
    assert paths.as_json() == {
        "etcd": "/cache/etcd-v3.7.3/bin/etcd",
        "kube-apiserver": "/cache/kubernetes-v1.37.2/bin/kube-apiserver",
        "kubectl": "/cache/kubernetes-v1.37.2/bin/kubectl",
        "crds": {"kueue": "/cache/crds/kueue-v0.12.3"},
    }


def test_a_new_version_is_a_new_folder() -> None:
    data = copy.deepcopy(MINIMAL)
    data["components"]["etcd"]["version"] = "v3.7.4"
    assert kube_paths(parse_versions(data), Path("/c")).binaries["etcd"] == Path("/c/etcd-v3.7.4/bin/etcd")


def test_cache_root_from_environment_or_home() -> None:
    assert cache_root({"GPUFLEET_GO_CACHE": "/srv/go"}, Path("/home/u")) == Path("/srv/go")
    assert cache_root({}, Path("/home/u")) == Path("/home/u/.cache/gpufleet/go")
    assert cache_root({"GPUFLEET_GO_CACHE": ""}, Path("/home/u")) == Path("/home/u/.cache/gpufleet/go")


def test_ldflags_stamp_the_release() -> None:
    comp = parse_versions(MINIMAL).component("kubernetes")
    assert comp.ldflags() == ["-X k8s.io/component-base/version.gitVersion=v1.37.2", "-X x.gitMinor=37"]


def _fake_build(paths_root: Path, names: list[str], crds: list[str]) -> None:
    paths = kube_paths(parse_versions(MINIMAL), paths_root)
    for n in names:
        p = paths.binaries[n]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    for c in crds:
        paths.crds[c].mkdir(parents=True, exist_ok=True)
        (paths.crds[c] / STAMP).write_text("{}")


def test_missing_binary_is_named_with_the_command_that_builds_it(tmp_path: Path) -> None:
    _fake_build(tmp_path, ["kube-apiserver", "kubectl"], [])
    with pytest.raises(KubeBinariesMissing) as err:
        require_kube_paths(parse_versions(MINIMAL), tmp_path)
    assert [name for name, _ in err.value.missing] == ["etcd", "crds/kueue"]
    msg = str(err.value)
    assert f"etcd: {tmp_path}/etcd-v3.7.3/bin/etcd" in msg
    assert f"crds/kueue: {tmp_path}/crds/kueue-v0.12.3" in msg
    assert f"`{BUILD_COMMAND}`" in msg and "tools/kube/versions.toml" in msg


def test_a_file_that_is_not_executable_counts_as_missing(tmp_path: Path) -> None:
    _fake_build(tmp_path, ["kube-apiserver", "kubectl", "etcd"], ["kueue"])
    etcd = tmp_path / "etcd-v3.7.3/bin/etcd"
    etcd.chmod(0o644)
    if os.access(etcd, os.X_OK):  # root may execute anything with an x bit... and reads mode bits
        pytest.skip("this user can execute a file without an x bit")
    assert [n for n, _ in missing_paths(kube_paths(parse_versions(MINIMAL), tmp_path))] == ["etcd"]


def test_everything_present_returns_the_paths(tmp_path: Path) -> None:
    _fake_build(tmp_path, ["kube-apiserver", "kubectl", "etcd"], ["kueue"])
    paths = require_kube_paths(parse_versions(MINIMAL), tmp_path)
    assert paths.binaries["etcd"] == tmp_path / "etcd-v3.7.3/bin/etcd"


def test_every_problem_at_once_with_its_path() -> None:
    data = copy.deepcopy(MINIMAL)
    data["components"]["etcd"]["version"] = "3.7.3"
    data["components"]["etcd"]["colour"] = "blue"
    data["components"]["etcd"]["binaries"] = {"kubectl": "go.etcd.io/etcd/etcdctl/v3"}
    data["crds"]["kueue"]["packages"] = ["../elsewhere"]
    data["extra"] = {}
    with pytest.raises(InputError) as err:
        parse_versions(data, "v.toml")
    assert sorted(str(p) for p in err.value.problems) == [
        "components.etcd.binaries.kubectl: also built by kubernetes",
        "components.etcd.colour: unknown key",
        "components.etcd.version: must be a Go module version like v1.2.3, got '3.7.3'",
        "crds.kueue.packages: must list package folders inside the module, like ./v1",
        "extra: unknown table",
    ]


GOMOD = """module x

go 1.26.0

replace (
\tk8s.io/api => k8s.io/api v0.37.2 // staging
\tk8s.io/kubectl => k8s.io/kubectl v0.37.1
)

require k8s.io/kubernetes v1.37.2

require (
\tk8s.io/api v0.37.2 // indirect
)

tool k8s.io/kubernetes/cmd/kubectl
"""


def test_parse_gomod_reads_single_lines_and_blocks() -> None:
    mod = parse_gomod(GOMOD)
    assert mod.requires == {"k8s.io/kubernetes": "v1.37.2", "k8s.io/api": "v0.37.2"}
    assert mod.replaces == {
        "k8s.io/api": ("k8s.io/api", "v0.37.2"),
        "k8s.io/kubectl": ("k8s.io/kubectl", "v0.37.1"),
    }
    assert mod.tools == {"k8s.io/kubernetes/cmd/kubectl"}


def test_gomod_disagreements_are_named() -> None:
    files = {
        "kubernetes/go.mod": GOMOD,
        "etcd/go.mod": "module y\nrequire go.etcd.io/etcd/server/v3 v3.7.2\ntool go.etcd.io/etcd/server/v3\n",
        "crds/go.mod": "module z\nrequire sigs.k8s.io/kueue v0.12.3\n",
    }
    problems = [str(p) for p in gomod_problems(parse_versions(MINIMAL), files.__getitem__)]
    assert problems == [
        "kubernetes/go.mod: no `tool k8s.io/kubernetes/cmd/kube-apiserver` line for kube-apiserver: "
        "run `go get -tool k8s.io/kubernetes/cmd/kube-apiserver`",
        "kubernetes/go.mod: replace k8s.io/kubectl => k8s.io/kubectl v0.37.1: every staging module is "
        "pinned to itself at v0.37.2",
        "etcd/go.mod: requires go.etcd.io/etcd/server/v3 v3.7.2, versions.toml says v3.7.3: "
        "run `go get go.etcd.io/etcd/server/v3@v3.7.3` in tools/kube/etcd",
    ]


# --- the committed files ------------------------------------------------------------------------


def test_committed_versions_load_and_name_the_sandbox_programs() -> None:
    v = load_versions()
    programs = set(kube_paths(v, Path("/c")).binaries)
    assert {
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "etcd",
        "kwok",
    } <= programs
    assert "controller-gen" in programs  # the CRDs are generated with it


def test_committed_gomods_agree_with_versions_toml() -> None:
    problems = gomod_problems(load_versions(), lambda rel: (TOOLS_DIR / rel).read_text())
    assert problems == [], "\n".join(map(str, problems))


def test_each_crd_source_is_the_charts_release_or_says_why_not() -> None:
    v = load_versions()
    for src in v.crds:
        assert src.chart in CHARTS, f"crds.{src.name}.chart: {src.chart!r} is not in gpufleet.infra.charts"
        same = src.version.lstrip("v") == CHARTS[src.chart].version.lstrip("v")
        assert same or src.chart_mismatch, (
            f"crds.{src.name}: {src.version} is not the chart's {CHARTS[src.chart].version}; "
            "take the chart's release or say why in chart_mismatch"
        )
        assert not (same and src.chart_mismatch), f"crds.{src.name}: chart_mismatch but the versions agree"
    for gap in v.unavailable:
        assert gap.chart in CHARTS and gap.kinds and gap.reason


def test_versions_file_is_plain_toml() -> None:
    assert tomllib.loads(VERSIONS_FILE.read_text())["components"]
