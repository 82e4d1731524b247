"""The sandbox project of a shipped stack: which secrets are placeholders to set again, and the
project folder (nothing of the repository written)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufleet.sandbox.pulumi_project import placeholder_secrets, secure_paths, write_project

REPO = Path(__file__).resolve().parents[3]

STACK = """\
config:
  kubernetes:context: prod
  gpufleet:storage:
    juicefs:
      name: ckpt
      metaUrl:
        secure: v1:AAAA
      accessKey:
        secure: v1:BBBB
  gpufleet:monitoring:
    grafanaAdminPassword:
      secure: v1:CCCC
    alertRoutes:
      - receiver: a
        token:
          secure: v1:DDDD
"""


def test_secure_paths_are_pulumi_config_path_expressions() -> None:
    config = yaml.safe_load(STACK)["config"]
    paths = [p for k, v in config.items() for p in secure_paths(v, k)]
    assert paths == [
        "gpufleet:storage.juicefs.metaUrl",
        "gpufleet:storage.juicefs.accessKey",
        "gpufleet:monitoring.grafanaAdminPassword",
        "gpufleet:monitoring.alertRoutes[0].token",
    ]


def test_placeholders_without_a_salt_are_dropped_and_listed() -> None:
    copy = placeholder_secrets(STACK)
    assert len(copy.to_set) == 4
    config = yaml.safe_load(copy.text)["config"]
    assert "secure" not in copy.text
    assert config["gpufleet:storage"]["juicefs"] == {"name": "ckpt"}
    assert config["gpufleet:monitoring"] == {"alertRoutes": [{"receiver": "a"}]}
    assert config["kubernetes:context"] == "prod"


def test_a_stack_with_a_salt_keeps_its_ciphertext() -> None:
    text = "encryptionsalt: v1:abc\n" + STACK
    copy = placeholder_secrets(text)
    assert copy.text == text and copy.to_set == ()


def test_project_folder_points_at_the_venv_and_links_the_program(tmp_path: Path) -> None:
    folder = write_project(REPO, tmp_path / "p", Path("/opt/venv"))
    project = yaml.safe_load((folder / "Pulumi.yaml").read_text())
    assert project["runtime"]["options"]["virtualenv"] == "/opt/venv"
    assert project["main"] == "infra/" and project["stackConfigDir"] == "stacks"
    assert (folder / "infra").resolve() == (REPO / "infra").resolve()
    assert (folder / "stacks").is_dir()
