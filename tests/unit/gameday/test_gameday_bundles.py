"""The game-day copies the diagnostic bundles an experiment's fault caused into its report, links
them from the experiment's section and lists them in summary.json."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from gpufleet.fleet.bundle.archive import members, write_bundle
from gpufleet.fleet.bundle.caps import SANDBOX_CAPS
from gpufleet.fleet.bundle.model import Manifest
from gpufleet.fleet.bundle.runner import Collector, Output
from gpufleet.gameday import Experiment, JournalFacts, SuiteRun, evaluate, summary_dict, write_report
from gpufleet.gameday.bundles import collect_for_report


def _bundle(d: Path, node: str, at: float) -> Path:
    cs = [Collector("agent-state", "agent/state.json", ["GET", "/state"]),
          Collector("metrics", "metrics/query_range.json", ["GET", "/api/v1/query_range"])]
    records, files = members(cs, {"agent-state": Output(b'{"events": []}', "ok", None, 0.1),
                                  "metrics": Output(b"", "timeout", None, 3.0, error="killed after 3 s")},
                            SANDBOX_CAPS)
    return write_bundle(d, Manifest(node=node, stack="sandbox", source="sandbox", trigger="node-health",
                                    reason="gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 3)",
                                    started_at=at, finished_at=at + 1.5, caps=SANDBOX_CAPS, members=records),
                        files)


def test_bundles_of_the_run_are_copied_and_described(tmp_path: Path) -> None:
    src, report = tmp_path / "sandbox-bundles", tmp_path / "report"
    _bundle(src, "gpu-0", 100.0)  # an earlier experiment's
    new = _bundle(src, "gpu-2", 200.0)
    (src / "bundle-bad-x.tar.gz").write_text("not a bundle")
    found = collect_for_report(src, since=150.0, report_dir=report)
    assert found[0]["path"] is None and "not a gzip-compressed tar archive" in found[0]["error"]
    assert found[1] == {"path": f"bundles/{new.name}", "node": "gpu-2",
                        "reason": "gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 3)",
                        "bytes": new.stat().st_size, "seconds": 1.5, "not_ok": ["metrics: timeout"]}
    assert [p.name for p in (report / "bundles").iterdir()] == [new.name]
    assert collect_for_report(tmp_path / "absent", 0.0, report) == []
    assert collect_for_report(None, 0.0, report) == []


def test_report_links_the_bundles(experiment: Callable[[str], Experiment],
                                  facts: Callable[[str], JournalFacts], tmp_path: Path) -> None:
    new = _bundle(tmp_path / "src", "gpu-2", 200.0)
    found = collect_for_report(tmp_path / "src", 0.0, tmp_path)
    r = evaluate(experiment("gpu-xid-79"), facts("gpu-xid-79"), journal=None, started_at=0.0,
                 wall_seconds=1.0)
    r = dataclasses.replace(r, extra={**r.extra, "bundles": found})
    run = SuiteRun("sandbox", "sandbox", 0.0, 1.0, 0.0, (r,))
    html = write_report(run, tmp_path)["html"].read_text()
    assert f'<a href="bundles/{new.name}">bundles/{new.name}</a>: node gpu-2' in html
    assert "not ok: metrics: timeout" in html
    doc = json.loads(json.dumps(summary_dict(run)))
    assert doc["experiments"][0]["bundles"][0]["node"] == "gpu-2"
