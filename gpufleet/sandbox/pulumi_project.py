"""The repository's Pulumi program for one shipped stack, in a project folder of its own, run with
the real CLI (`make pulumi-bins`) against a Kubernetes sandbox: the end-to-end tests and
benchmarks/pulumi_up.py use it.

The folder holds a copy of Pulumi.yaml (the Python runtime pointed at the project's virtual
environment by absolute path), `infra` (a link to the repository's program) and
`stacks/Pulumi.<stack>.yaml`, a copy of the shipped stack file, so nothing in the repository is
written. What the copy gets:
- `kubernetes:context` of the sandbox's admin kubeconfig (KUBECONFIG in the environment);
- `gpufleet:charts.source: disabled`: no chart repository is reachable here (docs/pulumi.md);
- secrets: a stack file with an `encryptionsalt` keeps its ciphertext (it must decrypt with the
  passphrase in the environment); one without (placeholder `secure:` values no key decrypts) has
  each of them set again with `pulumi config set --secret --path` (`placeholder_secrets`).

`secure_paths` and `placeholder_secrets` are pure; `PulumiProject.run` runs the CLI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.sandbox.pulumi_cli import PulumiPaths, file_backend, install_plugins, pulumi_env

CHARTS_DISABLED = ("--path", "gpufleet:charts.source", "disabled")


def secure_paths(value: Any, prefix: str) -> list[str]:
    """`pulumi config set --path` expressions of every `{secure: ...}` value under `prefix`."""
    if isinstance(value, Mapping):
        if set(value) == {"secure"}:
            return [prefix]
        return [p for k, v in value.items() for p in secure_paths(v, f"{prefix}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in secure_paths(v, f"{prefix}[{i}]")]
    return []


@dataclass(frozen=True)
class StackCopy:
    text: str  # the stack file for the project folder
    to_set: tuple[str, ...]  # secrets to set with `pulumi config set --secret --path`


def placeholder_secrets(stack_text: str) -> StackCopy:
    """The stack file as the project gets it: as it is when it has an `encryptionsalt` (real
    ciphertext); else without its placeholder `secure:` values, which are listed to be set again."""
    doc = yaml.safe_load(stack_text)
    if doc.get("encryptionsalt"):
        return StackCopy(stack_text, ())
    config = doc.get("config") or {}
    paths = [p for key, value in config.items() for p in secure_paths(value, key)]
    if not paths:
        return StackCopy(stack_text, ())
    config = {k: _without_secure(v) for k, v in config.items()}
    doc["config"] = {k: v for k, v in config.items() if v is not None}
    return StackCopy(yaml.safe_dump(doc, sort_keys=False), tuple(paths))


def _without_secure(value: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {"secure"}:
            return None
        kept = {k: _without_secure(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None}
    if isinstance(value, list):
        return [_without_secure(v) for v in value]
    return value


def sandbox_secret_value(path: str) -> str:
    """A value for a placeholder secret: says what it is, carries no credential."""
    return "gpufleet-sandbox-" + path.rsplit(".", 1)[-1].lower()


def write_project(repo: Path, dest: Path, venv: Path) -> Path:
    """The project folder: Pulumi.yaml with the venv's absolute path, `infra` linked, `stacks/`."""
    project = yaml.safe_load((repo / "Pulumi.yaml").read_text())
    project["runtime"]["options"]["virtualenv"] = str(venv)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    (dest / "infra").symlink_to(repo / "infra", target_is_directory=True)
    (dest / "stacks").mkdir(exist_ok=True)
    return dest


def policy_pack_copy(repo: Path, dest: Path) -> Path:
    """The project's policy pack as it is, in a folder of its own with the `venv` its
    PulumiPolicy.yaml names: an empty virtual environment that sees this environment's packages
    (pulumi, pulumi-policy) through a .pth file, so nothing is downloaded."""
    pack = dest / "policypack"
    shutil.copytree(repo / "policypack", pack, ignore=shutil.ignore_patterns("venv", "__pycache__"))
    venv = pack / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "gpufleet-parent.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return pack


class PulumiFailed(AssertionError):
    """A `pulumi` command exited non-zero; the message has the command and its output."""


@dataclass(frozen=True)
class PulumiProject:
    dir: Path
    stack: str
    paths: PulumiPaths
    env: dict[str, str]

    def run(
        self, *args: str, check: bool = True, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.paths.cli), *args, "--stack", self.stack, "--non-interactive"],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise PulumiFailed(
                f"pulumi {' '.join(args)} exited {proc.returncode}\n"
                f"--- stdout\n{proc.stdout[-20000:]}\n--- stderr\n{proc.stderr[-20000:]}"
            )
        return proc

    def config_set(self, *args: str) -> None:
        self.run("config", "set", *args)


def sandbox_project(
    repo: Path,
    work: Path,
    stack: str,
    paths: PulumiPaths,
    kubeconfig: Path,
    context: str,
    extra_config: Sequence[Sequence[str]] = (),
    base_env: Mapping[str, str] | None = None,
    stacks_dir: Path | None = None,
) -> PulumiProject:
    """A project folder under `work` for stack `stack` (its file in `stacks_dir`, default the
    repository's stacks/), its local backend and PULUMI_HOME (the provider installed), the stack
    initialised and configured for the sandbox."""
    folder = write_project(repo, work / "project", Path(sys.prefix))
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    env = pulumi_env(paths, work / "pulumi-home", file_backend(state), base_env or os.environ)
    env["KUBECONFIG"] = str(kubeconfig)
    install_plugins(paths, env)
    source = (stacks_dir or repo / "stacks") / f"Pulumi.{stack}.yaml"
    copy = placeholder_secrets(source.read_text())
    (folder / "stacks" / f"Pulumi.{stack}.yaml").write_text(copy.text)
    project = PulumiProject(folder, stack, paths, env)
    subprocess.run(
        [str(paths.cli), "stack", "init", stack, "--secrets-provider", "passphrase", "--non-interactive"],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    for path in copy.to_set:
        project.config_set("--secret", "--path", path, sandbox_secret_value(path))
    project.config_set("kubernetes:context", context)
    project.config_set(*CHARTS_DISABLED)
    for setting in extra_config:
        project.config_set(*setting)
    return project
