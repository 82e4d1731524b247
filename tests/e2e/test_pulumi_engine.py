"""End-to-end: the real Pulumi CLI, built from pinned Go modules (`make pulumi-bins`, ADR 0035).

No cluster: a tiny Python program declares a Namespace and a ConfigMap through a Kubernetes provider
in `renderYamlToDirectory` mode, which writes the objects as YAML files instead of calling an API
server. With the built CLI, the project's Python language host and the built Kubernetes provider
(installed into this run's PULUMI_HOME at the version pulumi_kubernetes asks for), in a local file
backend with the passphrase secrets provider: login, stack init, preview, up (files written), the
project's policy pack on a preview (passes; then a ConfigMap with a plain-text password is refused
by its `credentials-only-in-secrets` policy), destroy (files removed), stack rm.

Needs the programs `make pulumi-bins` builds (`make test` and `make e2e` build them first); no root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from gpufleet.sandbox.pulumi_cli import (
    PulumiPaths,
    file_backend,
    install_plugins,
    pulumi_env,
    require_pulumi_paths,
)
from gpufleet.sandbox.pulumi_project import policy_pack_copy

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
STACK = "smoke"

PROGRAM = '''\
"""A Namespace and a ConfigMap, rendered to YAML files by the Kubernetes provider."""
import pulumi
import pulumi_kubernetes as k8s

config = pulumi.Config()
render = k8s.Provider("render", render_yaml_to_directory=config.require("renderDir"))
opts = pulumi.ResourceOptions(provider=render)
ns = k8s.core.v1.Namespace("smoke", metadata={"name": "gpufleet-smoke"}, opts=opts)
data = {"NCCL_DEBUG": "WARN"}
if config.get_bool("leakPassword"):
    data["adminPassword"] = "hunter2"  # what the policy pack must refuse
settings = k8s.core.v1.ConfigMap(
    "settings",
    metadata={"name": "smoke-settings", "namespace": ns.metadata["name"]},
    data=data,
    opts=opts,
)
pulumi.export("namespace", ns.metadata["name"])
pulumi.export("token", config.require_secret("token"))
'''


@dataclass(frozen=True)
class Cli:
    paths: PulumiPaths
    env: dict[str, str]
    program: Path
    rendered: Path
    policy_pack: Path
    state: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.paths.cli), *args, "--non-interactive"],
            cwd=self.program,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"pulumi {' '.join(args)} exited {proc.returncode}\n"
                f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
            )
        return proc


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    paths = require_pulumi_paths()  # fails, naming `make pulumi-bins`, when they are not built
    root = tmp_path_factory.mktemp("pulumi-cli")
    program = root / "program"
    program.mkdir()
    (program / "__main__.py").write_text(PROGRAM)
    # The program runs in this test's own virtual environment (the project's), by absolute path.
    (program / "Pulumi.yaml").write_text(
        textwrap.dedent(f"""\
            name: gpufleet-cli-smoke
            runtime:
              name: python
              options:
                toolchain: pip
                virtualenv: {sys.prefix}
            """)
    )
    state = root / "state"
    state.mkdir()
    env = pulumi_env(paths, root / "pulumi-home", file_backend(state), os.environ)
    install_plugins(paths, env)
    yield Cli(paths, env, program, root / "rendered", policy_pack_copy(REPO, root), state)


def rendered_objects(folder: Path) -> dict[tuple[str, str], dict[str, object]]:
    objects = {}
    for f in sorted(folder.rglob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def test_versions_are_the_built_ones(cli: Cli) -> None:
    out = cli("version").stdout.strip()
    assert out == cli.paths.cli_version
    host = subprocess.run(
        [str(cli.paths.binaries["pulumi-language-python"]), "-version"], capture_output=True, text=True
    )
    assert host.stdout.strip() == cli.paths.cli_version
    plugins = cli("plugin", "ls", "--json").stdout
    assert {(p["kind"], p["name"], p["version"]) for p in json.loads(plugins)} >= {
        ("resource", "kubernetes", cli.paths.plugins[0].version)
    }


def test_login_and_a_stack_with_the_passphrase_secrets_provider(cli: Cli) -> None:
    cli("login", file_backend(cli.state))
    assert file_backend(cli.state) in cli("whoami", "--verbose").stdout
    cli("stack", "init", STACK, "--secrets-provider", "passphrase")
    cli("config", "set", "renderDir", str(cli.rendered))
    cli("config", "set", "--secret", "token", "s3cr3t")
    stack_file = (cli.program / f"Pulumi.{STACK}.yaml").read_text()
    assert "encryptionsalt:" in stack_file and "secure:" in stack_file and "s3cr3t" not in stack_file


def test_preview_plans_the_objects_without_writing_them(cli: Cli) -> None:
    out = cli("preview", "--diff").stdout
    assert "kubernetes:core/v1:Namespace" in out and "kubernetes:core/v1:ConfigMap" in out
    assert "+ 4 to create" in out or "4 to create" in out, out  # stack, provider, namespace, configmap
    assert not cli.rendered.exists()


def test_up_writes_the_yaml_and_the_outputs(cli: Cli) -> None:
    cli("up", "--yes", "--skip-preview")
    objects = rendered_objects(cli.rendered)
    assert set(objects) == {("Namespace", "gpufleet-smoke"), ("ConfigMap", "smoke-settings")}
    assert objects[("ConfigMap", "smoke-settings")]["data"] == {"NCCL_DEBUG": "WARN"}
    outputs = json.loads(cli("stack", "output", "--json", "--show-secrets").stdout)
    assert outputs == {"namespace": "gpufleet-smoke", "token": "s3cr3t"}
    state = cli("stack", "export").stdout
    assert "s3cr3t" not in state  # the secret is encrypted with the passphrase in the state too


def test_the_projects_policy_pack_runs_under_the_real_cli(cli: Cli) -> None:
    ok = cli("preview", "--policy-pack", str(cli.policy_pack))
    assert "gpufleet" in ok.stdout, ok.stdout  # the pack is reported by name
    cli("config", "set", "leakPassword", "true")
    try:
        refused = cli("preview", "--policy-pack", str(cli.policy_pack), check=False)
    finally:
        cli("config", "rm", "leakPassword")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert "credentials-only-in-secrets" in text and "data.adminPassword" in text, text
    assert "mandatory" in text.lower(), text


def test_destroy_removes_the_files_and_the_stack(cli: Cli) -> None:
    cli("destroy", "--yes", "--skip-preview")
    assert rendered_objects(cli.rendered) == {}
    cli("stack", "rm", STACK, "--yes")
    assert STACK not in cli("stack", "ls").stdout


@pytest.mark.parametrize(
    ("source", "said", "not_said"),
    [
        # An exception: logged once through the engine with its traceback (the host answers "bail").
        ("raise ValueError('gpufleet-smoke: bad input')\n", "raised an exception", "exited with status"),
        # An exit with a status of the program's own: the host reports the status.
        ("import sys\nsys.exit(3)\n", "Python exited with status 3", "raised an exception"),
    ],
)
def test_a_failing_program_is_reported_by_the_language_host(
    cli: Cli, tmp_path: Path, source: str, said: str, not_said: str
) -> None:
    folder = tmp_path / "failing"
    folder.mkdir()
    (folder / "__main__.py").write_text(source)
    project = (cli.program / "Pulumi.yaml").read_text().replace("gpufleet-cli-smoke", "gpufleet-cli-failing")
    (folder / "Pulumi.yaml").write_text(project)
    failing = replace(cli, program=folder)
    failing("stack", "init", "failing", "--secrets-provider", "passphrase")
    try:
        res = failing("preview", "--stack", "failing", check=False)
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert said in out and not_said not in out, out
        if "ValueError" in source:
            assert out.count("ValueError: gpufleet-smoke: bad input") == 1, out
    finally:
        failing("stack", "rm", "failing", "--yes")
