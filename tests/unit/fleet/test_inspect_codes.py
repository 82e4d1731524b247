"""Consistency of inspect's codes and thresholds with the fault catalog (both directions where
there are two): every code names a fault that exists, and a fault with an alert has its runbook."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.errors import InputError
from gpufleet.fleet.inspect.codes import CODES, PERF_METRIC_CODES
from gpufleet.fleet.inspect.thresholds import THRESHOLDS_FILE, load_thresholds, parse_thresholds

CAT = load_catalog()
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_maps_to_a_catalog_fault_and_its_runbook(code: str) -> None:
    spec = CODES[code]
    if spec.fault_id is None:  # XID codes: the fault is the XID's; checked below
        return
    fault = CAT.get(spec.fault_id)
    assert fault is not None, f"{code} names fault {spec.fault_id}, which the catalog lacks"
    if fault.alert is not None:
        assert fault.runbook is not None and (REPO / fault.runbook).is_file(), f"{code}: no {fault.runbook}"
    else:
        assert fault.exemption, f"{code}: {fault.id} has neither an alert nor an exemption"


def test_every_catalog_xid_resolves_to_a_fault() -> None:
    table, problems = xid_policy(CAT, {})
    assert not problems
    for xid, rule in table.items():
        assert rule.fault_id is not None and CAT.get(rule.fault_id) is not None, xid


def test_codes_are_unique_and_well_formed() -> None:
    names = [c.name for c in CODES.values()]
    assert len(set(names)) == len(names)
    assert all(c.startswith("GFI") and len(c) == 6 for c in CODES)


def test_every_perf_metric_has_a_code() -> None:
    assert set(PERF_METRIC_CODES.values()) <= set(CODES)


def test_every_threshold_has_a_source_and_every_sku_metric_a_code() -> None:
    t = load_thresholds()
    doc = yaml.safe_load(THRESHOLDS_FILE.read_text())
    for name, entry in doc["defaults"].items():
        assert entry["source"], name
    for sku, entry in t.skus.items():
        assert sku in set(AcceleratorModel)
        for metric, ref in entry.perf.items():
            assert metric in PERF_METRIC_CODES, f"{sku.value}: {metric} has no code"
            assert ref.value > 0 and ref.source


def test_a_bad_thresholds_file_names_the_path_and_the_problem() -> None:
    doc = yaml.safe_load(THRESHOLDS_FILE.read_text())
    doc["skus"]["nvidia-h100-sxm"]["perf"]["h2d_gbs"] = {"value": "fast"}
    with pytest.raises(InputError) as e:
        parse_thresholds(doc, "thresholds.yaml")
    text = e.value.render()
    assert "skus.nvidia-h100-sxm.perf.h2d_gbs.value" in text and "source" in text
