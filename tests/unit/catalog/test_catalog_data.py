"""The shipped catalog data: coverage of the issue's fault list, rates, injections, metric names."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest
from pydantic import ValidationError

from gpufleet.catalog import INJECTION_MODELS, Catalog, load_catalog, parse_injection
from gpufleet.catalog.injection import METHODS, XID_FIELD, DcgmInject, LinkFlap, with_overrides
from gpufleet.catalog.rules import rule_groups
from gpufleet.core.taxonomy import FaultClass, LadderAction

REQUIRED_XIDS = {13, 31, 43, 45, 48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}
# Root-cause rows of the Llama 3 table (failure-data.md); "Server chassis, IO expansion board,
# dependency, CPU, system memory" is five rows of 2 each.
LLAMA3_CAUSES = {
    "Faulty GPU": 148, "GPU HBM3 memory": 72, "Software bug": 54, "Network switch/cable": 35,
    "Host maintenance (unplanned)": 32, "GPU SRAM memory": 19, "GPU system processor": 17, "NIC": 7,
    "NCCL watchdog timeouts": 7, "Silent data corruption": 6, "GPU thermal interface + sensor": 6,
    "SSD": 3, "Power supply": 3, "Server chassis": 2, "IO expansion board": 2, "Dependency": 2, "CPU": 2,
    "System memory": 2,
}
GPU_HOURS = 16_384 * 54 * 24  # failure-data.md: the denominator of the (D) rates


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _cause(text: str) -> str:
    return re.sub(r"\s*\(\d+ of 419.*\)$", "", text)


def test_every_required_xid_is_in_the_catalog(catalog: Catalog) -> None:
    assert set(catalog.by_xid()) >= REQUIRED_XIDS


def test_every_fault_class_is_used(catalog: Catalog) -> None:
    unused = [c.value for c in FaultClass if not catalog.of_class(c)]
    assert unused == [], f"fault classes without a fault: {unused}"


def test_xid45_is_secondary_to_any_and_never_acts(catalog: Catalog) -> None:
    f = catalog.by_xid()[45]
    assert f.action is LadderAction.NONE
    assert f.escalation is None
    assert f.dedup is not None and f.dedup.secondary_to == ["any"]


def test_isolating_classes_have_isolating_actions(catalog: Catalog) -> None:
    for f in catalog.of_class(FaultClass.GPU_FATAL):
        assert f.action.isolates_node, f"{f.id}: gpu-fatal but action {f.action.value}"


def test_shares_sum_to_one_per_cause(catalog: Catalog) -> None:
    shares: dict[str, float] = defaultdict(float)
    rates: dict[str, set[float]] = defaultdict(set)
    for f in catalog:
        if f.rate:
            cause = _cause(f.rate.cause)
            shares[cause] += f.rate.share
            rates[cause].add(f.rate.per_million_gpu_hours or -1)
    bad = {c: s for c, s in shares.items() if not math.isclose(s, 1.0, abs_tol=1e-9)}
    assert bad == {}, f"shares per cause must sum to 1.0: {bad}"
    inconsistent = {c: r for c, r in rates.items() if len(r) != 1}
    assert inconsistent == {}, f"entries of one cause disagree on its rate: {inconsistent}"


def test_every_llama3_cause_is_covered_with_its_published_rate(catalog: Catalog) -> None:
    by_cause = {_cause(f.rate.cause): f.rate for f in catalog if f.rate}
    assert set(LLAMA3_CAUSES) <= set(by_cause), f"uncovered: {set(LLAMA3_CAUSES) - set(by_cause)}"
    for cause, count in LLAMA3_CAUSES.items():
        rate = by_cause[cause]
        assert rate.per_million_gpu_hours is not None
        # The (D) figure is count / GPU-hours, printed to 2 significant decimals in failure-data.md.
        assert rate.per_million_gpu_hours == pytest.approx(count / GPU_HOURS * 1e6, rel=0.03), cause
        texts = [f.rate.cause for f in catalog if f.rate and _cause(f.rate.cause) == cause]
        assert all(f"{count} of 419" in t for t in texts), texts


def test_every_rate_names_its_source(catalog: Catalog) -> None:
    for f in catalog:
        if f.rate:
            assert re.search(r"\((P|A|S|D)\)", f.rate.source), f"{f.id}: source lacks a P/A/S/D tag"


def test_the_vocabulary_is_one_union_of_strict_models() -> None:
    # One model per method, each rejecting unknown keys: the catalog loader is the validator.
    assert len(METHODS) == len(INJECTION_MODELS) == 23
    for method, model in METHODS.items():
        assert model.model_config.get("extra") == "forbid", method
        assert parse_injection({"method": method, **_minimal(method)}).method == method


def _minimal(method: str) -> dict[str, object]:
    return {
        "dcgm-inject": {"fieldId": 230, "value": 79}, "exporter-inject": {"metric": "gpu_health", "value": 0},
        "node-reboot": {}, "link-down": {"rail": 0},
        "link-flap": {"rail": 0, "periodSeconds": 4, "count": 5},
        "link-degrade": {"rail": 0, "lossPercent": 1},
        "storage-slow": {"rateMbit": 10}, "kill-rank": {"rank": 0},
        "host-signal": {"signal": "psu-state", "value": 2}, "switch-down": {"rail": 0},
        "nic-remove": {"rail": 0}, "osd-kill": {"osd": 0}, "osd-hang": {"osd": 0},
    }.get(method, {})


@pytest.mark.parametrize(("doc", "message"), [
    ({"method": "dcgm-inject", "fieldId": 150, "value": 95, "kmsg": True}, "only with fieldId 230"),
    ({"method": "dcgm-inject", "fieldId": 230, "value": 1000}, "XID code"),
    ({"method": "link-degrade", "rail": 0}, "lossPercent and/or rateMbit"),
    ({"method": "link-degrade", "rail": 0, "lossPercent": 100}, "less than 100"),
    ({"method": "host-signal", "signal": "psu-state"}, "exactly one of value or add"),
    ({"method": "host-signal", "signal": "fan", "value": 1}, "unknown host signal"),
    ({"method": "host-signal", "signal": "edac-ue", "add": 1, "effect": "melt"}, "'crash' or 'sigbus'"),
    ({"method": "node-reboot", "downSeconds": 601}, "less than or equal to 600"),
    ({"method": "storage-slow", "delayMs": 5000}, "Extra inputs"),
])
def test_injection_bounds(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_injection(doc)


def test_overrides_replace_parameters_and_keep_the_method() -> None:
    base = parse_injection({"method": "link-flap", "rail": 0, "periodSeconds": 4, "count": 5})
    got = with_overrides(base, {"count": 2, "period_seconds": 1})
    assert got == LinkFlap(rail=0, period_seconds=1, count=2)
    with pytest.raises(ValueError, match="cannot change the method"):
        with_overrides(base, {"method": "link-down"})
    with pytest.raises(ValidationError):
        with_overrides(base, {"count": 0})


def test_overrides_differ_from_the_common_injection(catalog: Catalog) -> None:
    # An override that repeats `injection` is the duplication the single entry removed.
    for f in catalog:
        for backend, inj in f.injection_overrides.items():
            assert inj != f.injection, f"{f.id}: the {backend} override repeats `injection`; delete it"


def test_xid_injections_inject_their_own_xid(catalog: Catalog) -> None:
    for xid, f in catalog.by_xid().items():
        for inj in [f.injection, *f.injection_overrides.values()]:
            if isinstance(inj, DcgmInject) and inj.field_id == XID_FIELD:
                assert inj.value == xid, f.id


def test_fabric_rules_read_only_the_declared_fabric(catalog: Catalog) -> None:
    """Rendered with the default settings (the sandbox's), every fabric selector matches the
    sandbox's fabric interface and never its management interface or an undeclared HCA."""
    for group in rule_groups(catalog):
        for r in group["rules"]:
            for regex in re.findall(r'device=~"([^"]+)"', str(r["expr"])):
                name = r.get("alert") or r.get("record")
                assert re.fullmatch(regex, "fab0"), f"{name}: {regex} does not match fab0"
                for other in ("mgmt0", "eth0", "mlx5_1"):
                    assert not re.fullmatch(regex, other), f"{name}: {regex} matches {other}"


def test_exemptions_say_how_the_fault_is_detected(catalog: Catalog) -> None:
    for f in catalog:
        if f.exemption:
            assert re.search(r"detect|fires|marks|recorded|announced", f.exemption, re.I), f.id


def test_every_fault_has_an_injection_or_says_why_none_is_possible(catalog: Catalog) -> None:
    """Issue 9: every catalog fault can be rehearsed, or the catalog says why not (noInjection)."""
    for f in catalog:
        assert (f.injection is None) != (f.no_injection is None), f"{f.id}: give injection or noInjection"
        if f.no_injection is not None:
            assert len(f.no_injection) >= 30, f"{f.id}: noInjection must say why"
