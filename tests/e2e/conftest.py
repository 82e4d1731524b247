"""Fixtures of the end-to-end sandbox tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import load_catalog

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _end_adhoc_chaos_runs() -> Iterator[None]:
    """A test that calls chaos actions from Python starts an ad-hoc run whose pollers (the scheduler
    and training pods, up to 30 minutes) would outlive its sandbox and go on polling it in the
    later tests' time; stopped after each test."""
    yield
    engine = sys.modules.get("gpufleet.chaos.engine")
    if engine is not None:
        engine.end_runs()


@pytest.fixture(scope="session")
def sandbox_rule_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return rule_files(tmp_path_factory.mktemp("rules"))


def rule_files(tmp: Path) -> list[Path]:
    """The repo's generated rule file; until it exists, the catalog's GPU alerts written the same way
    (name, expr, for, severity) so the alert assertion still tests the catalog's own expression."""
    generated = REPO / "monitoring" / "rules" / "gpufleet.rules.yaml"
    if generated.exists():
        return [generated]
    rules = []
    for f in load_catalog():
        if f.alert is None or not f.id.startswith("gpu-"):
            continue
        rules.append(
            {
                "alert": f.alert.name,
                "expr": f.alert.expr,
                "for": f.alert.for_,
                "labels": {"severity": getattr(f.severity, "value", str(f.severity))},
            }
        )
    path = tmp / "catalog-gpu.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gpufleet-gpu", "rules": rules}]}, sort_keys=False))
    return [path]
