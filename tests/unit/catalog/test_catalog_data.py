"""The shipped catalog data: coverage of the issue's fault list, rates, injections, metric names."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest

from gpufleet.catalog import Catalog, load_catalog
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
# The injection vocabulary the chaos extension implements, with required and optional params.
METHODS: dict[str, tuple[set[str], set[str]]] = {
    "dcgm-inject": ({"fieldId", "value"}, {"kmsg", "burst"}),
    "node-crash": (set(), set()),
    "node-hang": (set(), set()),
    "node-reboot": (set(), set()),
    "link-down": ({"rail"}, set()),
    "link-flap": ({"rail", "periodSeconds", "count"}, set()),
    "link-degrade": ({"rail"}, {"lossPercent", "rateMbit"}),
    "storage-outage": (set(), set()),
    "storage-slow": ({"delayMs"}, set()),
    "kill-rank": ({"rank"}, set()),
    "host-signal": ({"signal"}, {"value", "add", "effect"}),
    "switch-down": ({"rail"}, set()),
    "nic-remove": ({"rail"}, set()),
}


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


def test_injections_use_the_chaos_vocabulary(catalog: Catalog) -> None:
    for f in catalog:
        for backend, inj in f.injection.items():
            assert inj.method in METHODS, f"{f.id}/{backend}: unknown method {inj.method}"
            required, optional = METHODS[inj.method]
            params = set(inj.params)
            assert required <= params, f"{f.id}/{backend}: {inj.method} needs {required - params}"
            extra = params - required - optional
            assert not extra, f"{f.id}/{backend}: unknown params {extra}"
            if inj.method == "link-degrade":
                assert params & {"lossPercent", "rateMbit"}, f"{f.id}: needs lossPercent or rateMbit"


def test_xid_injections_inject_their_own_xid(catalog: Catalog) -> None:
    for xid, f in catalog.by_xid().items():
        for inj in f.injection.values():
            if inj.method == "dcgm-inject" and inj.params["fieldId"] == 230:
                assert inj.params["value"] == xid, f.id


def test_fabric_rules_match_the_sandbox_interfaces(catalog: Catalog) -> None:
    for f in catalog:
        if f.alert and "node_network_" in f.alert.expr:
            for regex in re.findall(r'device=~"([^"]+)"', f.alert.expr):
                for dev in ("fab0", "fab1", "ib0", "enp1s0f0"):
                    assert re.fullmatch(regex, dev), f"{f.alert.name}: {regex} does not match {dev}"
                assert not re.fullmatch(regex, "eth0"), f"{f.alert.name}: {regex} matches the management eth0"


def test_exemptions_say_how_the_fault_is_detected(catalog: Catalog) -> None:
    for f in catalog:
        if f.exemption:
            assert re.search(r"detect|fires|marks|recorded|announced", f.exemption, re.I), f.id
