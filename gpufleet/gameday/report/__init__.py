"""Game-day report: summary.json, JUnit XML, single-file HTML, journals."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.core.gameday_summary import SCHEMA
from gpufleet.gameday.report.html import html_report
from gpufleet.gameday.report.junit import junit_xml
from gpufleet.gameday.report.summary import SuiteRun, experiment_doc, summary_dict

__all__ = [
    "SCHEMA", "SuiteRun", "experiment_doc", "html_report", "junit_xml", "summary_dict", "write_report",
]


def write_report(run: SuiteRun, directory: Path) -> dict[str, Path]:
    """Write summary.json, junit.xml and report.html into `directory` (journals are already in
    `directory/journals`, written there by the runner). Returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "summary": directory / "summary.json",
        "junit": directory / "junit.xml",
        "html": directory / "report.html",
    }
    paths["summary"].write_text(json.dumps(summary_dict(run), indent=2) + "\n", encoding="utf-8")
    paths["junit"].write_text(junit_xml(run), encoding="utf-8")
    paths["html"].write_text(html_report(run), encoding="utf-8")
    return paths
