"""The inspect report links each failing node's diagnostic bundle; a node that passes has none."""

from __future__ import annotations

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.fleet.inspect.checks import Pins
from gpufleet.fleet.inspect.report import attach_bundles, failing_nodes, to_doc, to_html
from gpufleet.fleet.inspect.sweep import run_sweep
from gpufleet.fleet.inspect.synthetic import Degradations, fleet_runs
from gpufleet.fleet.inspect.thresholds import load_thresholds

CAT = load_catalog()


def test_failing_nodes_get_a_bundle_link_in_the_report() -> None:
    rules, _ = xid_policy(CAT, {})
    obs = next(iter(fleet_runs(["gpu-0", "gpu-1", "gpu-2"], 1, 5, Degradations(slow="gpu-1"))))
    out = run_sweep(run_id="r0", stack="sandbox", level="full", at=obs[0].at, observations=obs, past=[],
                    thresholds=load_thresholds(), xid_rules=rules, pins={"gpu": Pins()})
    doc = to_doc(out, CAT)
    failing = failing_nodes(doc)
    assert list(failing) == ["gpu-1"]
    assert failing["gpu-1"].startswith("GFI050 ")
    attach_bundles(doc, {"gpu-1": {"path": "bundles/bundle-gpu-1-x-inspect.tar.gz", "bytes": 1234,
                                   "not_ok": ["metrics: timeout"]}})
    html = to_html(doc)
    assert html.count("diagnostic bundle:") == 1
    assert ('<a href="bundles/bundle-gpu-1-x-inspect.tar.gz">bundles/bundle-gpu-1-x-inspect.tar.gz</a>'
            in html) and "not ok: metrics: timeout" in html
