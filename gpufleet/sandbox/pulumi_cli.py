"""Run the real Pulumi CLI built from pinned Go modules: its paths, its environment, its plugins.

`make pulumi-bins` (tools/kube/build.py --group pulumi) builds the CLI, the project's Python
language host and the Kubernetes provider into the version-keyed cache (docs/pulumi.md, ADR 0035):

    ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}/pulumi-<version>/bin/{pulumi,pulumi-language-python}
    ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}/pulumi-kubernetes-<version>/bin/pulumi-resource-kubernetes

What it takes to run `pulumi` with them:
  - `pulumi_paths(versions, root)` (pure) and `require_pulumi_paths()` (which names what is missing
    and says to run `make pulumi-bins`);
  - `pulumi_env(paths, home, backend_url, base)` (pure): the environment for every `pulumi` command
    (the CLI's folder first on PATH, the language host beside it; PULUMI_HOME the caller's; no update
    check, no plugin download, no plugin taken from PATH; the local backend; the passphrase);
  - `plugin_installs(paths, home)` (pure) and `install_plugins(paths, env)`: each provider goes into
    PULUMI_HOME's plugin cache at the version its Python SDK asks the engine for (`pulumi plugin
    install resource kubernetes 4.25.0 --file <program>`), once per PULUMI_HOME.

Nothing here starts the CLI except `install_plugins`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.sandbox.kube.binaries import cache_root, component_dir
from gpufleet.sandbox.kube.versions import PULUMI_GROUP, VERSIONS_FILE, KubeVersions, load_versions

BUILD_COMMAND = "make pulumi-bins"
CLI = "pulumi"
LANGUAGE_HOST = "pulumi-language-python"
# The passphrase of the sandbox's and the tests' throw-away stacks (passphrase secrets provider), and
# the TEST passphrase every shipped stack file's `secure:` values are encrypted under (each file has its
# own `encryptionsalt`; docs/pulumi.md "Secrets"): not a secret, it protects nothing but test values.
# A real deployment sets its own secrets and moves the stack off it with `pulumi stack
# change-secrets-provider`.
SANDBOX_PASSPHRASE = "gpufleet-sandbox"


@dataclass(frozen=True)
class PluginInstall:
    """One provider for PULUMI_HOME's plugin cache, at the version its SDK asks for."""

    kind: str  # "resource"
    name: str  # "kubernetes"
    version: str  # "4.25.0": the release without "v", as `pulumi plugin install` takes it
    program: Path  # the built pulumi-resource-kubernetes

    def plugin_dir(self, home: Path) -> Path:
        """Where `pulumi plugin install` puts it: <home>/plugins/<kind>-<name>-v<version>."""
        return home / "plugins" / f"{self.kind}-{self.name}-v{self.version}"

    def command(self, cli: Path) -> list[str]:
        install = ["plugin", "install", self.kind, self.name, self.version]
        return [str(cli), *install, "--file", str(self.program)]


@dataclass(frozen=True)
class PulumiPaths:
    """The built CLI, its language host and the providers, for one versions file and cache."""

    cli: Path
    cli_version: str  # "v3.277.0"
    binaries: Mapping[str, Path]  # every program of the group, by name
    plugins: tuple[PluginInstall, ...]

    @property
    def bin_dir(self) -> Path:
        """The CLI's folder: it goes first on PATH; the language host is found beside the CLI."""
        return self.cli.parent


def pulumi_paths(versions: KubeVersions, root: Path) -> PulumiPaths:
    """Pure: where build.py puts the `pulumi` group's programs for these versions."""
    binaries: dict[str, Path] = {}
    plugins: list[PluginInstall] = []
    cli_version = ""
    for comp in versions.in_group(PULUMI_GROUP):
        for program in comp.binaries:
            binaries[program] = component_dir(root, comp) / "bin" / program
        if CLI in comp.binaries:
            cli_version = comp.release_version
        if comp.plugin is not None:
            plugins.append(
                PluginInstall(
                    kind=comp.plugin.kind,
                    name=comp.plugin.name,
                    version=comp.fields()["release_number"],
                    program=binaries[comp.plugin.program],
                )
            )
    if CLI not in binaries or LANGUAGE_HOST not in binaries:
        raise ValueError(
            f"{VERSIONS_FILE.name} builds no {CLI} and {LANGUAGE_HOST} in group {PULUMI_GROUP!r}"
        )
    return PulumiPaths(binaries[CLI], cli_version, binaries, tuple(plugins))


class PulumiBinariesMissing(RuntimeError):
    """Some of the Pulumi programs are not built; the message names each and the command to run."""

    def __init__(self, missing: list[tuple[str, Path]]) -> None:
        self.missing = missing
        lines = [f"  {name}: {path}" for name, path in missing]
        super().__init__(
            f"{len(missing)} Pulumi program(s) not built:\n"
            + "\n".join(lines)
            + f"\nRun `{BUILD_COMMAND}` (tools/kube/build.py --group pulumi; it builds them from the "
            f"versions in {VERSIONS_FILE.relative_to(VERSIONS_FILE.parents[2])})."
        )


def missing_programs(paths: PulumiPaths) -> list[tuple[str, Path]]:
    """(name, path) of each program that is not an executable file."""
    return [
        (name, path)
        for name, path in sorted(paths.binaries.items())
        if not (path.is_file() and os.access(path, os.X_OK))
    ]


def require_pulumi_paths(versions: KubeVersions | None = None, root: Path | None = None) -> PulumiPaths:
    """The paths once every program is built; else PulumiBinariesMissing."""
    versions = load_versions() if versions is None else versions
    paths = pulumi_paths(versions, cache_root() if root is None else root)
    missing = missing_programs(paths)
    if missing:
        raise PulumiBinariesMissing(missing)
    return paths


def file_backend(state_dir: Path) -> str:
    """The URL of Pulumi's local (file) backend keeping its state in `state_dir`."""
    return "file://" + str(state_dir.absolute())


# Variables of the caller's environment that would make the CLI do something else than asked: log
# in to Pulumi Cloud, read the passphrase from a file, or run a different engine.
_DROPPED = ("PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_DEBUG_LANGUAGES", "PULUMI_ROOT")


def pulumi_env(
    paths: PulumiPaths,
    home: Path,
    backend_url: str,
    base: Mapping[str, str],
    passphrase: str = SANDBOX_PASSPHRASE,
) -> dict[str, str]:
    """Pure: the environment to run `pulumi` with (every other variable of `base` kept)."""
    env = {k: v for k, v in base.items() if k not in _DROPPED}
    path = base.get("PATH", "")
    env["PATH"] = str(paths.bin_dir) + (os.pathsep + path if path else "")
    env["PULUMI_HOME"] = str(home)
    env["PULUMI_BACKEND_URL"] = backend_url
    env["PULUMI_CONFIG_PASSPHRASE"] = passphrase
    env["PULUMI_SKIP_UPDATE_CHECK"] = "true"
    # Plugins come only from PULUMI_HOME (installed by install_plugins) and from beside the CLI
    # (the language host): never a download, never a pulumi-resource-* that happens to be on PATH.
    env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] = "true"
    env["PULUMI_IGNORE_AMBIENT_PLUGINS"] = "true"
    return env


def plugin_installs(paths: PulumiPaths, home: Path) -> list[PluginInstall]:
    """Pure but for reading `home`: the providers not yet in this PULUMI_HOME's plugin cache."""
    return [p for p in paths.plugins if not (p.plugin_dir(home) / p.program.name).is_file()]


class PluginInstallError(RuntimeError):
    """`pulumi plugin install` failed; the message has its command and output."""


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def install_plugins(paths: PulumiPaths, env: Mapping[str, str], run: Runner = subprocess.run) -> list[str]:
    """Install each missing provider into env's PULUMI_HOME with the CLI itself; returns their names."""
    home = Path(env["PULUMI_HOME"])
    done: list[str] = []
    for plugin in plugin_installs(paths, home):
        argv: Sequence[str] = plugin.command(paths.cli)
        proc = run(argv, env=dict(env), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise PluginInstallError(
                f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        done.append(f"{plugin.kind}-{plugin.name}-v{plugin.version}")
    return done
