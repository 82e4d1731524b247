"""infra/__main__.py, the Pulumi entry point, run as the Pulumi language host runs it (as
`__main__`), with stack configuration handed over the way the engine does (JSON strings,
`secure:` values already decrypted) and the mock runtime standing in for the engine."""

from __future__ import annotations

import json
import runpy
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest
import yaml
from infra_testdata import ROOT

from gpufleet.infra.offline import SECRET_MARK, record_program

MAIN = str(ROOT / "infra" / "__main__.py")
PLAIN_META_URL = "redis://:hunter2@redis-meta.storage:6379/1"


def engine_config(stack: str, decrypt: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The stack file's config as the engine passes it: namespaced keys, JSON-encoded objects,
    each `secure:` replaced by its decrypted value; the keys holding a secret are listed."""
    doc = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    secret_keys: list[str] = []

    def walk(v: Any, key: str) -> Any:
        if isinstance(v, dict) and set(v) == {"secure"}:
            secret_keys.append(key)
            return decrypt.get(v["secure"], "decrypted")
        if isinstance(v, dict):
            return {k: walk(x, key) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, key) for x in v]
        return v

    config = {
        k: json.dumps(walk(v, k)) if isinstance(v, dict | list) else str(v) for k, v in doc["config"].items()
    }
    return config, sorted(set(secret_keys))


@pytest.fixture
def configured() -> Iterator[None]:
    yield
    pulumi.runtime.set_all_config({}, [])


def test_entry_point_builds_the_stack_and_keeps_decrypted_values_secret(configured: None) -> None:
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.h200-ib.yaml").read_text())
    cipher = doc["config"]["gpufleet:storage"]["juicefs"]["metaUrl"]["secure"]
    config, secret_keys = engine_config("h200-ib", {cipher: PLAIN_META_URL})
    assert secret_keys == ["gpufleet:monitoring", "gpufleet:storage"]
    pulumi.runtime.set_all_config(config, secret_keys)
    resources = record_program(lambda: runpy.run_path(MAIN, run_name="__main__"), "h200-ib")
    types = {r.type for r in resources}
    assert "gpufleet:platform:Platform" in types and "kubernetes:core/v1:NodePatch" in types
    secrets = [
        r
        for r in resources
        if r.type == "kubernetes:core/v1:Secret" and r.inputs["metadata"]["name"] != "grafana-admin"
    ]
    # The JuiceFS CSI Secret and the backups' copy (ADR 0060), both whole Pulumi secrets.
    names = sorted(r.inputs["metadata"]["name"] for r in secrets)
    assert names == ["gpufleet-backup-juicefs", "juicefs-ckpt"]
    assert all(r.inputs["stringData"] == SECRET_MARK for r in secrets)
    # The decrypted credential reached the program but no resource input in the clear.
    assert PLAIN_META_URL not in json.dumps([r.inputs for r in resources])


def test_entry_point_rejects_unknown_keys_with_their_path(configured: None) -> None:
    config, secret_keys = engine_config("mi300x-roce", {})
    config["gpufleet:nodePool"] = "[]"  # a typo of nodePools
    pulumi.runtime.set_all_config(config, secret_keys)
    with pytest.raises(pulumi.RunError) as err:
        record_program(lambda: runpy.run_path(MAIN, run_name="__main__"), "mi300x-roce")
    assert "nodePool: unknown key" in str(err.value)
    assert "stacks/Pulumi.mi300x-roce.yaml" in str(err.value)
