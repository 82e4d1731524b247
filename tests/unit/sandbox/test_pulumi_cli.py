"""The Pulumi CLI built from pinned Go modules (gpufleet.sandbox.pulumi_cli, tools/kube/build.py --group
pulumi): versions, paths, the environment, plugin installs, the SDK pins. No Go, no CLI needed."""

from __future__ import annotations

import copy
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpufleet.core.errors import InputError
from gpufleet.sandbox.kube import kube_paths, load_versions, parse_versions
from gpufleet.sandbox.kube.versions import PULUMI_GROUP, REPO_ROOT, TOOLS_DIR
from gpufleet.sandbox.pulumi_cli import (
    BUILD_COMMAND,
    SANDBOX_PASSPHRASE,
    PluginInstallError,
    PulumiBinariesMissing,
    file_backend,
    install_plugins,
    plugin_installs,
    pulumi_env,
    pulumi_paths,
    require_pulumi_paths,
)

MINIMAL: dict[str, Any] = {
    "components": {
        "etcd": {
            "module": "go.etcd.io/etcd/server/v3",
            "version": "v3.7.3",
            "dir": "etcd",
            "binaries": {"etcd": "go.etcd.io/etcd/server/v3"},
        },
        "pulumi": {
            "group": "pulumi",
            "module": "github.com/pulumi/pulumi/pkg/v3",
            "version": "v3.277.0",
            "dir": "pulumi",
            "binaries": {
                "pulumi": "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi",
                "pulumi-language-python": "./pulumi-language-python",
            },
            "tags": ["osusergo", "grpcnotrace"],
            "stamp": {"github.com/pulumi/pulumi/sdk/v3/go/common/version.Version": "{version}"},
        },
        "pulumi-kubernetes": {
            "group": "pulumi",
            "module": "github.com/pulumi/pulumi-kubernetes/provider/v4",
            "version": "v4.0.0-20260115033456-f47bc2d6f199",
            "release": "v4.25.0",
            "dir": "pulumi-kubernetes",
            "binaries": {"pulumi-resource-kubernetes": "./pulumi-resource-kubernetes"},
            "plugin": {"kind": "resource", "name": "kubernetes", "program": "pulumi-resource-kubernetes"},
            "stamp": {"x/pkg/version.Version": "{release_number}"},
            "generate": {
                "package": "github.com/pulumi/pulumi-kubernetes/provider/v4/cmd/pulumi-resource-kubernetes",
                "program": "generate.go",
                "reads": ["schema.json"],
                "writes": ["schema-embed.json"],
                "into": "./pulumi-resource-kubernetes",
                "env": {"VERSION": "{release_number}"},
            },
        },
    }
}
CLI_DIR = Path("/c/pulumi-v3.277.0/bin")
PROVIDER = Path("/c/pulumi-kubernetes-v4.0.0-20260115033456-f47bc2d6f199/bin/pulumi-resource-kubernetes")


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_build_script", TOOLS_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


# --- versions and paths ---------------------------------------------------------------------------


def test_paths_are_keyed_by_version_and_the_plugin_by_the_release() -> None:
    paths = pulumi_paths(parse_versions(MINIMAL), Path("/c"))
    assert paths.cli == CLI_DIR / "pulumi"
    assert paths.bin_dir == CLI_DIR
    assert paths.cli_version == "v3.277.0"
    assert paths.binaries == {
        "pulumi": CLI_DIR / "pulumi",
        "pulumi-language-python": CLI_DIR / "pulumi-language-python",
        "pulumi-resource-kubernetes": PROVIDER,
    }
    (plugin,) = paths.plugins
    assert (plugin.kind, plugin.name, plugin.version, plugin.program) == (
        "resource",
        "kubernetes",
        "4.25.0",
        PROVIDER,
    )
    assert plugin.plugin_dir(Path("/h")) == Path("/h/plugins/resource-kubernetes-v4.25.0")
    assert plugin.command(paths.cli) == [
        str(CLI_DIR / "pulumi"),
        *("plugin", "install", "resource", "kubernetes", "4.25.0", "--file", str(PROVIDER)),
    ]


def test_the_sandbox_programs_do_not_include_the_pulumi_group() -> None:
    # `make kube-bins`, require_kube_paths and `sandbox doctor --kubernetes` ask only for the kube group.
    assert set(kube_paths(parse_versions(MINIMAL), Path("/c")).binaries) == {"etcd"}


def test_stamp_and_generator_fields_use_the_release() -> None:
    v = parse_versions(MINIMAL)
    provider = v.component("pulumi-kubernetes")
    assert provider.ldflags() == ["-X x/pkg/version.Version=4.25.0"]
    assert provider.fields()["release"] == "v4.25.0"
    assert v.component("pulumi").ldflags() == [
        "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v3.277.0"
    ]
    assert v.component("pulumi").local_packages() == ["./pulumi-language-python"]
    assert [c.name for c in v.in_group(PULUMI_GROUP)] == ["pulumi", "pulumi-kubernetes"]


def test_new_keys_are_validated_all_at_once() -> None:
    data = copy.deepcopy(MINIMAL)
    comp = data["components"]["pulumi-kubernetes"]
    comp["group"] = "helm"
    comp["tags"] = ["bad tag"]
    comp["release"] = "4.25"
    comp["plugin"] = {"kind": "language", "name": "kubernetes", "program": "kubectl"}
    comp["generate"]["into"] = "./elsewhere"
    comp["generate"]["reads"] = ["../schema.json"]
    comp["generate"]["env"] = {"VERSION": "{colour}"}
    comp["binaries"]["odd"] = "../outside"
    comp["cgo"] = "yes"
    with pytest.raises(InputError) as err:
        parse_versions(data, "v.toml")
    prefix = "components.pulumi-kubernetes"
    assert sorted(str(p) for p in err.value.problems) == [
        f"{prefix}.binaries.odd: a package of the project's own is ./<folder> of its dir",
        f"{prefix}.cgo: must be true or false, got 'yes'",
        f"{prefix}.generate.env.VERSION: unknown field(s) ['colour']",
        f"{prefix}.generate.into: must be one of this component's own packages (./<folder>)",
        f"{prefix}.generate.reads: must list file names (no folders)",
        f"{prefix}.group: must be one of kube, pulumi, got 'helm'",
        f"{prefix}.plugin.kind: must be one of resource",
        f"{prefix}.plugin.program: must be one of this component's binaries",
        f"{prefix}.release: must be a Go module version like v1.2.3, got '4.25'",
        f"{prefix}.tags: must list go build tags (letters, digits, '_', '.')",
    ]


def test_missing_programs_are_named_with_the_command_that_builds_them(tmp_path: Path) -> None:
    v = parse_versions(MINIMAL)
    cli = pulumi_paths(v, tmp_path).cli
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    with pytest.raises(PulumiBinariesMissing) as err:
        require_pulumi_paths(v, tmp_path)
    assert [name for name, _ in err.value.missing] == ["pulumi-language-python", "pulumi-resource-kubernetes"]
    assert f"`{BUILD_COMMAND}`" in str(err.value) and "tools/kube/versions.toml" in str(err.value)


# --- the environment and the plugin cache ------------------------------------------------------------


def test_env_puts_the_cli_first_and_closes_every_other_door() -> None:
    paths = pulumi_paths(parse_versions(MINIMAL), Path("/c"))
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "PULUMI_ACCESS_TOKEN": "pul-123",
        "PULUMI_CONFIG_PASSPHRASE_FILE": "/etc/pass",
        "PULUMI_BACKEND_URL": "https://api.pulumi.com",
    }
    before = dict(base)
    env = pulumi_env(paths, Path("/run/home"), file_backend(Path("/run/state")), base)
    assert base == before  # pure
    assert env == {
        "PATH": f"{CLI_DIR}:/usr/bin:/bin",
        "HOME": "/root",
        "PULUMI_HOME": "/run/home",
        "PULUMI_BACKEND_URL": "file:///run/state",
        "PULUMI_CONFIG_PASSPHRASE": SANDBOX_PASSPHRASE,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
    }
    assert pulumi_env(paths, Path("/h"), "file:///s", {}, passphrase="p")["PATH"] == str(CLI_DIR)
    assert pulumi_env(paths, Path("/h"), "file:///s", {}, passphrase="p")["PULUMI_CONFIG_PASSPHRASE"] == "p"


def test_plugins_are_installed_once_per_home_with_the_cli(tmp_path: Path) -> None:
    paths = pulumi_paths(parse_versions(MINIMAL), Path("/c"))
    env = pulumi_env(paths, tmp_path, "file:///s", {"PATH": "/bin"})
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        assert kw["env"]["PULUMI_HOME"] == str(tmp_path)
        installed = tmp_path / "plugins" / "resource-kubernetes-v4.25.0"
        installed.mkdir(parents=True)
        (installed / "pulumi-resource-kubernetes").write_text("")
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert install_plugins(paths, env, fake_run) == ["resource-kubernetes-v4.25.0"]
    assert calls == [paths.plugins[0].command(paths.cli)]
    assert plugin_installs(paths, tmp_path) == []
    assert install_plugins(paths, env, fake_run) == []  # already there: the CLI is not started
    assert len(calls) == 1


def test_a_failed_install_says_what_ran_and_what_it_printed(tmp_path: Path) -> None:
    paths = pulumi_paths(parse_versions(MINIMAL), Path("/c"))
    env = pulumi_env(paths, tmp_path, "file:///s", {})

    def failing(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 255, "", "error: no such file\n")

    with pytest.raises(PluginInstallError, match=r"plugin install resource kubernetes 4\.25\.0 .*exit 255"):
        install_plugins(paths, env, failing)


# --- build.py: the group, the flags, the stamps ------------------------------------------------------


def test_build_selects_by_group_and_only_spans_groups() -> None:
    build = _build_script()
    v = parse_versions(MINIMAL)
    assert build.select(v, []) == ["etcd", "crds"]
    assert build.select(v, [], "pulumi") == ["pulumi", "pulumi-kubernetes"]
    assert build.select(v, ["pulumi-kubernetes"]) == ["pulumi-kubernetes"]
    assert build.make_target("pulumi") == BUILD_COMMAND
    # Messages name the make target of what was selected, whichever way it was selected.
    assert build.label_of(v, ["pulumi-kubernetes"], "kube") == "pulumi-bins"
    assert build.label_of(v, ["crds"], "pulumi") == "kube-bins"
    assert build.label_of(v, ["etcd", "pulumi"], "kube") == "go-bins"
    assert build.label_of(v, [], "pulumi") == "pulumi-bins"


def test_build_flags_and_stamps_of_the_pulumi_components(tmp_path: Path) -> None:
    build = _build_script()
    v = load_versions()
    cli = v.component("pulumi")
    assert build.build_flags(cli) == [
        "-trimpath",
        "-tags",
        "osusergo,grpcnotrace",
        "-ldflags",
        "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v3.277.0",
    ]
    step = build.component_step(tmp_path, v.component("pulumi-kubernetes"))
    assert step.inputs["release"] == "v4.25.0"
    assert step.inputs["generate"]["env"] == {"VERSION": "4.25.0"}
    assert re.fullmatch(r"[0-9a-f]{64}", step.inputs["sources"])
    # The sandbox's components keep the stamp they had, so extending build.py rebuilt none of them.
    # (A component built from a pseudo-version also records the release it is, as the GPU Operator;
    # one built with cgo records that, as runc.)
    for comp in v.in_group("kube"):
        assert set(build.component_step(tmp_path, comp).inputs) == {
            "format",
            "component",
            "module",
            "version",
            "binaries",
            "build_flags",
            "go_mod_sum",
        } | ({"release"} if comp.release else set()) | ({"cgo"} if comp.cgo else set())
    assert [c.name for c in v.in_group("kube") if c.cgo] == ["runc"]


# --- the committed files ------------------------------------------------------------------------------


def test_committed_pulumi_group_builds_the_cli_its_host_and_the_provider() -> None:
    v = load_versions()
    paths = pulumi_paths(v, Path("/c"))
    assert set(paths.binaries) == {"pulumi", "pulumi-language-python", "pulumi-resource-kubernetes"}
    assert [(p.kind, p.name) for p in paths.plugins] == [("resource", "kubernetes")]
    cli = v.component("pulumi")
    # The host is built in the CLI's go build, on the SDK of the CLI's own release.
    assert cli.also_pinned["github.com/pulumi/pulumi/sdk/v3"] == cli.version
    for comp in v.in_group(PULUMI_GROUP):
        for package in comp.local_packages():
            assert (TOOLS_DIR / comp.go_dir / package / "main.go").is_file(), f"{comp.name}: {package}"


def _pinned(requirements: list[str], name: str) -> str:
    for req in requirements:
        m = re.fullmatch(rf"{re.escape(name)}==([0-9][0-9.]*)", req)
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml pins no exact {name}==X (the built CLI and providers need one)")


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("."))


def test_python_sdk_pins_agree_with_the_built_cli_and_provider() -> None:
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    paths = pulumi_paths(load_versions(), Path("/c"))
    # pulumi_kubernetes asks the engine for resource-kubernetes v<its own version>: exactly the built one.
    (provider,) = paths.plugins
    assert _pinned(deps, "pulumi-kubernetes") == provider.version, (
        "pyproject.toml's pulumi-kubernetes must be the provider's release in tools/kube/versions.toml"
    )
    # The engine serves SDKs of its own release and older ones.
    assert _as_tuple(_pinned(deps, "pulumi")) <= _as_tuple(paths.cli_version)
