"""The stack's dr targets: read from gpufleet:dr, and an RPO shorter than the backup interval is
refused with its path (a checkpoint can wait a whole interval for its backup)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet.config.load import load_stack
from gpufleet.core.errors import InputError

STACK = Path(__file__).parents[3] / "stacks" / "Pulumi.sandbox-storage.yaml"


def test_the_storage_stack_declares_its_targets() -> None:
    spec = load_stack(STACK)
    assert spec.dr is not None
    assert (spec.dr.rpo_seconds, spec.dr.rto_seconds, spec.dr.backup_interval_seconds) == (30, 60, 5)


def test_an_rpo_shorter_than_the_backup_interval_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load(STACK.read_text())
    doc["config"]["gpufleet:dr"] = {"rpoSeconds": 2, "rtoSeconds": 60, "backupIntervalSeconds": 5}
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as e:
        load_stack(bad)
    said = e.value.render()
    assert "dr" in said and "rpoSeconds 2 is shorter than backupIntervalSeconds 5" in said
