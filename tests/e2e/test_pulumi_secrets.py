"""End-to-end: the stacks' secrets under the real Pulumi CLI (`make pulumi-bins`, ADR 0035), with the
local file backend and the passphrase secrets provider (docs/pulumi.md "Secrets").

- Every shipped stack file decrypts as it is under the documented TEST passphrase: `pulumi stack
  init` accepts its `encryptionsalt` without rewriting the file, and every `secure:` value in it
  decrypts (`pulumi config get --path`) to the test value docs/pulumi.md lists; a wrong passphrase is
  refused; the documented rotation to a passphrase of one's own (`pulumi stack
  change-secrets-provider`) keeps every value.
- The real entry point (infra/__main__.py) stops a production stack whose credential was set
  without `--secret`, naming the key.
- A value set with `pulumi config set --secret --path` stays ciphertext in the stack file and in the
  state after `pulumi up`: a program that reads the stack as the entry point does and hands its
  secrets to the components' `secret_input` (Kubernetes Secrets) and to the game-day's stack copy
  (`stack_document`, a ConfigMap), through a provider in `renderYamlToDirectory` mode, because the
  whole platform needs a cluster (that deployment is tests/e2e's `pulumi up` tests' business).
- The project's policy pack refuses a credential left in plain stack config where it reaches a
  ConfigMap (the sandbox stack, whose model accepts plain values), and passes the same stack as shipped.

Needs the programs `make pulumi-bins` builds; no root, no cluster.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_pulumi_engine import Cli, rendered_objects

from gpufleet.sandbox.pulumi_cli import file_backend, install_plugins, pulumi_env, require_pulumi_paths
from gpufleet.sandbox.pulumi_project import policy_pack_copy, secure_paths

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
GRAFANA = "monitoring.grafanaAdminPassword"

# The TEST values behind the shipped stacks' `secure:` lines (docs/pulumi.md "Secrets"): what
# `pulumi config get --path` must return under the test passphrase. A stack gaining a secret must
# document it here and there.
_JUICEFS_META = {
    "ascend-910b-roce": "redis://redis-meta:6379/2",
    "b200-roce": "tikv://tikv-pd.storage:2379/b200",
    "h200-ib": "redis://redis-meta.storage:6379/1",
    "scale-10k": "tikv://tikv-pd:2379/scale",
}
TEST_SECRETS: dict[str, dict[str, str]] = {s: {} for s in STACKS}
for _s, _url in _JUICEFS_META.items():
    TEST_SECRETS[_s] |= {
        "storage.juicefs.metaUrl": _url,
        "storage.juicefs.accessKey": f"test-access-key-{_s}",
        "storage.juicefs.secretKey": f"test-secret-key-{_s}",
    }
for _s in (*_JUICEFS_META, "mi300x-roce"):
    TEST_SECRETS[_s]["monitoring.grafanaAdminPassword"] = f"test-grafana-admin-{_s}"

# Reads the stack as infra/__main__.py does (its own read_stack_config, the keys Pulumi decrypted
# counted as encrypted at rest), then passes the secrets on as the components do.
PROGRAM = '''\
"""The entry point's stack reading and the components' secret handling, rendered to YAML files."""
import importlib.util

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime.config import is_config_secret

from gpufleet.config import parse_stack
from gpufleet.config.model import decrypted_by_pulumi
from gpufleet.infra.common import secret_input
from gpufleet.infra.gameday import stack_document

entry_spec = importlib.util.spec_from_file_location("gpufleet_entry", "@ENTRY@")
entry = importlib.util.module_from_spec(entry_spec)
entry_spec.loader.exec_module(entry)

data = entry.read_stack_config()
decrypted = frozenset(k for k in data if is_config_secret(f"gpufleet:{k}"))
with decrypted_by_pulumi(decrypted):
    spec = parse_stack(data, f"stacks/Pulumi.{pulumi.get_stack()}.yaml")
render = k8s.Provider("render", render_yaml_to_directory=pulumi.Config().require("renderDir"))
opts = pulumi.ResourceOptions(provider=render)
for _key, path, secret in spec.secrets():
    name = path.replace(".", "-").lower()
    k8s.core.v1.Secret(
        name, metadata={"name": name}, string_data={"value": secret_input(secret)}, opts=opts
    )
k8s.core.v1.ConfigMap(
    "stack-copy", metadata={"name": "stack-copy"}, data={"stack.yaml": stack_document(spec)}, opts=opts
)
pulumi.export("secrets", len(spec.secrets()))
'''


def stack_secure_paths(stack_file: Path) -> dict[str, str]:
    """`gpufleet:` path (without the namespace) -> ciphertext of every `secure:` value in the file."""
    config = yaml.safe_load(stack_file.read_text())["config"]
    out = {}
    for key, value in config.items():
        if not key.startswith("gpufleet:"):
            continue
        for expr in secure_paths(value, key):
            cur: Any = config
            top, *rest = expr.split(".")
            for part in [top, *rest]:
                cur = cur[part]
            out[expr.removeprefix("gpufleet:")] = cur["secure"]
    return out


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def project(dest: Path, name: str, main: Path | None) -> Path:
    """A Pulumi project in `dest` with a copy of the shipped stack files (stackConfigDir: stacks),
    running `main` (the repo's infra/ through a link, or a program written here) in this test's
    virtual environment."""
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "stacks", dest / "stacks")
    if main is not None:
        (dest / "infra").symlink_to(main)
    (dest / "Pulumi.yaml").write_text(
        textwrap.dedent(f"""\
            name: {name}
            runtime:
              name: python
              options:
                toolchain: pip
                virtualenv: {sys.prefix}
            main: infra/
            stackConfigDir: stacks
            """)
    )
    return dest


@dataclass(frozen=True)
class Projects:
    shipped: Cli  # the repo's own program (infra/) over copies of the shipped stacks
    flow: Cli  # PROGRAM over copies of the shipped stacks, rendering to YAML files


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Projects]:
    paths = require_pulumi_paths()  # fails, naming `make pulumi-bins`, when they are not built
    root = tmp_path_factory.mktemp("pulumi-secrets")
    state = root / "state"
    state.mkdir()
    env = pulumi_env(paths, root / "pulumi-home", file_backend(state), os.environ)
    install_plugins(paths, env)
    pack = policy_pack_copy(REPO, root)
    shipped = project(root / "shipped", "gpufleet", REPO / "infra")
    flow_program = root / "flow-program"
    flow_program.mkdir()
    (flow_program / "__main__.py").write_text(PROGRAM.replace("@ENTRY@", str(REPO / "infra" / "__main__.py")))
    flow = project(root / "flow", "gpufleet-secrets-flow", flow_program)
    yield Projects(
        Cli(paths, env, shipped, root / "rendered-shipped", pack, state),
        Cli(paths, env, flow, root / "rendered-flow", pack, state),
    )


@pytest.fixture(scope="module")
def initialised(projects: Projects) -> Projects:
    """Every shipped stack created in the backend from its file as it is."""
    for stack in STACKS:
        projects.shipped("stack", "init", stack, "--secrets-provider", "passphrase")
    return projects


@pytest.mark.parametrize("stack", STACKS)
def test_a_shipped_stack_decrypts_as_it_is_under_the_test_passphrase(
    initialised: Projects, stack: str
) -> None:
    cli = initialised.shipped
    stack_file = cli.program / "stacks" / f"Pulumi.{stack}.yaml"
    # `stack init` took the file's encryptionsalt as it is: nothing rewritten.
    assert stack_file.read_bytes() == (REPO / "stacks" / f"Pulumi.{stack}.yaml").read_bytes()
    assert "encryptionsalt: v1:" in stack_file.read_text()
    ciphertexts = stack_secure_paths(stack_file)
    assert sorted(ciphertexts) == sorted(TEST_SECRETS[stack]), "every secure: value is documented"
    for path, expected in TEST_SECRETS[stack].items():
        assert expected not in stack_file.read_text()
        got = cli("config", "get", "--path", f"gpufleet:{path}", "--stack", stack).stdout.strip()
        assert got == expected, path


def test_a_wrong_passphrase_is_refused(initialised: Projects) -> None:
    cli = replace(initialised.shipped, env=initialised.shipped.env | {"PULUMI_CONFIG_PASSPHRASE": "not-it"})
    out = cli("config", "get", "--path", f"gpufleet:{GRAFANA}", "--stack", "h200-ib", check=False)
    assert out.returncode != 0 and "incorrect passphrase" in out.stderr, out.stderr
    assert "test-grafana-admin" not in out.stdout


def test_a_user_rotates_the_test_passphrase_to_their_own(initialised: Projects) -> None:
    """docs/pulumi.md "Secrets": `pulumi stack change-secrets-provider passphrase` with the test
    passphrase in PULUMI_CONFIG_PASSPHRASE reads the new one at its prompt (here: standard input)."""
    cli = initialised.shipped
    stack_file = cli.program / "stacks" / "Pulumi.b200-roce.yaml"
    shipped = stack_file.read_bytes()
    own = f"own-{uuid.uuid4().hex}"
    try:
        rotated = subprocess.run(
            [str(cli.paths.cli), "stack", "change-secrets-provider", "passphrase", "--stack", "b200-roce"],
            cwd=cli.program,
            env=cli.env,
            input=f"{own}\n{own}\n",
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        assert stack_file.read_bytes() != shipped  # a new encryptionsalt and new ciphertext
        mine = replace(cli, env=cli.env | {"PULUMI_CONFIG_PASSPHRASE": own})
        for path, expected in TEST_SECRETS["b200-roce"].items():
            got = mine("config", "get", "--path", f"gpufleet:{path}", "--stack", "b200-roce").stdout
            assert got.strip() == expected, path
        old = cli("config", "get", "--path", f"gpufleet:{GRAFANA}", "--stack", "b200-roce", check=False)
        assert old.returncode != 0 and "incorrect passphrase" in old.stderr
    finally:
        cli("stack", "rm", "b200-roce", "--yes", "--force", "--preserve-config")
        stack_file.write_bytes(shipped)
        cli("stack", "init", "b200-roce", "--secrets-provider", "passphrase")


def test_the_entry_point_stops_a_production_stack_with_a_plain_text_credential(initialised: Projects) -> None:
    cli = initialised.shipped
    stack_file = cli.program / "stacks" / "Pulumi.h200-ib.yaml"
    shipped = stack_file.read_bytes()
    try:
        cli("config", "set", "--path", f"gpufleet:{GRAFANA}", "plain-text", "--stack", "h200-ib")
        refused = cli("preview", "--stack", "h200-ib", check=False)
    finally:
        stack_file.write_bytes(shipped)
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert "monitoring.grafanaAdminPassword: a plain-text secret in a production stack" in text, text


def test_a_secret_set_by_the_cli_is_ciphertext_in_the_stack_file_and_in_the_state(projects: Projects) -> None:
    cli = projects.flow
    stack = "h200-ib"
    stack_file = cli.program / "stacks" / f"Pulumi.{stack}.yaml"
    cli("stack", "init", stack, "--secrets-provider", "passphrase")
    cli("config", "set", "renderDir", str(cli.rendered), "--stack", stack)
    fresh = f"fresh-{uuid.uuid4().hex}"
    before = stack_secure_paths(stack_file)[GRAFANA]
    cli("config", "set", "--secret", "--path", f"gpufleet:{GRAFANA}", fresh, "--stack", stack)
    after = stack_secure_paths(stack_file)[GRAFANA]
    assert fresh not in stack_file.read_text()
    assert after != before and after.startswith("v1:")

    cli("up", "--yes", "--skip-preview", "--stack", stack)
    plaintexts = [fresh, *(v for p, v in TEST_SECRETS[stack].items() if p != GRAFANA)]
    # The provider keeps a Secret's stringData as base64 `data`: each value in either form.
    forms = [f for v in plaintexts for f in (v, b64(v))]
    # The values did reach the program and the state: shown with --show-secrets only.
    shown = cli("stack", "export", "--show-secrets", "--stack", stack).stdout
    assert [v for v in plaintexts if v not in shown and b64(v) not in shown] == []
    exported = cli("stack", "export", "--stack", stack).stdout
    assert [f for f in forms if f in exported] == []
    assert exported.count('"ciphertext"') >= len(plaintexts)  # one per Secret at least
    # The backend's own files (checkpoint, backups, history) hold neither form either.
    for f in cli.state.rglob("*"):
        if f.is_file():
            raw = f.read_bytes()
            assert [x for x in forms if x.encode() in raw] == [], f
    objects = rendered_objects(cli.rendered)
    copy = str(yaml.safe_dump(objects[("ConfigMap", "stack-copy")]["data"]))
    assert "redacted-by-gpufleet" in copy and not any(v in copy for v in plaintexts)
    cli("destroy", "--yes", "--skip-preview", "--stack", stack)
    cli("stack", "rm", stack, "--yes")


def test_the_policy_pack_refuses_a_credential_left_in_plain_stack_config(projects: Projects) -> None:
    cli = projects.flow
    stack = "sandbox"  # the sandbox model accepts plain values: only the policy pack stands in the way
    stack_file = cli.program / "stacks" / f"Pulumi.{stack}.yaml"
    shipped = stack_file.read_bytes()
    cli("stack", "init", stack, "--secrets-provider", "passphrase")
    cli("config", "set", "renderDir", str(cli.rendered), "--stack", stack)
    ok = cli("preview", "--stack", stack, "--policy-pack", str(cli.policy_pack))
    assert "gpufleet" in ok.stdout, ok.stdout
    leaked = "s3://ckpt:plain-password@minio.storage:9000/checkpoints"
    cli("config", "set", "--path", "gpufleet:storage.checkpoint.location", leaked, "--stack", stack)
    try:
        refused = cli("preview", "--stack", stack, "--policy-pack", str(cli.policy_pack), check=False)
    finally:
        cli("stack", "rm", stack, "--yes", "--force")
        stack_file.write_bytes(shipped)
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert "credentials-only-in-secrets" in text and "a URL with a password" in text, text
    assert "mandatory" in text.lower(), text
