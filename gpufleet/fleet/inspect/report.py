"""The sweep's report: one JSON document, one single-file HTML page (jinja2, autoescaped) and JUnit
XML for CI, a row per node with its findings, trend and delta columns, and the lemon list."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jinja2

from gpufleet.catalog import Catalog
from gpufleet.fleet.inspect.codes import CODES
from gpufleet.fleet.inspect.sweep import SweepOutcome

TEMPLATES = Path(__file__).with_name("templates")


def _runbook(catalog: Catalog, fault_id: str | None) -> str | None:
    if fault_id is None:
        return None
    fault = catalog.get(fault_id)
    return fault.runbook if fault is not None else None


def to_doc(out: SweepOutcome, catalog: Catalog) -> dict[str, Any]:
    rows = []
    for row in out.rows:
        r = row.result
        rows.append({
            "node": r.node, "pool": r.pool, "status": r.status, "full": r.full, "plan": row.reason,
            "findings": [
                {"code": f.code, "name": f.name, "severity": f.severity.value, "fault_id": f.fault_id,
                 "runbook": _runbook(catalog, f.fault_id), "subject": f.subject, "detail": f.detail,
                 "value": f.value, "limit": f.limit}
                for f in r.findings
            ],
            "skipped": list(r.skipped), "unknown": list(r.unknown), "metrics": r.metrics,
            "deltas": row.deltas, "trends": row.trends,
            "lemon": None if row.lemon is None else {"reason": row.lemon.reason,
                                                     "bottom_runs": row.lemon.bottom_runs,
                                                     "exclusions": row.lemon.exclusions},
        })
    counts: dict[str, int] = {}
    for row in out.rows:
        counts[row.result.status] = counts.get(row.result.status, 0) + 1
    return {
        "run_id": out.run_id, "stack": out.stack, "level": out.level, "at": out.at,
        "at_iso": dt.datetime.fromtimestamp(out.at, dt.UTC).isoformat(timespec="seconds"),
        "summary": counts, "lemons": [lm.node for lm in out.lemons],
        "pairs": [list(p) for p in out.plan.pairs], "nodes": rows,
        "codes": {c.code: {"name": c.name, "severity": c.severity.value, "fault_id": c.fault_id}
                  for c in CODES.values()},
    }


def failing_nodes(doc: dict[str, Any]) -> dict[str, str]:
    """Failing node -> its first failing finding, which names the node's bundle."""
    return {n["node"]: next(f"{f['code']} {f['name']} {f['subject']}: {f['detail']}" for f in n["findings"]
                            if f["severity"] == "fail")
            for n in doc["nodes"] if n["status"] == "fail"}


def attach_bundles(doc: dict[str, Any], bundles: dict[str, dict[str, object]]) -> None:
    """Link each failing node's diagnostic bundle (gpufleet.fleet.bundle) from its row."""
    for n in doc["nodes"]:
        if n["node"] in bundles:
            n["bundle"] = bundles[n["node"]]


def _spark(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return bars[3] * len(values)
    return "".join(bars[int((v - lo) / (hi - lo) * (len(bars) - 1))] for v in values)


def to_html(doc: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["spark"] = _spark
    return env.get_template("inspect.html.j2").render(doc=doc)


def to_junit(doc: dict[str, Any]) -> str:
    """One testcase per node: a failure when the node fails, an error when it could not be checked."""
    nodes = doc["nodes"]
    fails = sum(1 for n in nodes if n["status"] == "fail")
    errors = sum(1 for n in nodes if n["status"] == "unknown")
    suites = ET.Element("testsuites", name="gpufleet-inspect", tests=str(len(nodes)), failures=str(fails),
                        errors=str(errors))
    suite = ET.SubElement(suites, "testsuite", name=f"inspect.{doc['stack']}.{doc['level']}",
                          tests=str(len(nodes)), failures=str(fails), errors=str(errors), skipped="0")
    for n in nodes:
        case = ET.SubElement(suite, "testcase", classname=f"inspect.{doc['stack']}.{n['pool']}",
                             name=n["node"])
        lines = [f"{f['code']} {f['name']} {f['subject']}: {f['detail']} (fault {f['fault_id']})"
                 for f in n["findings"]]
        lines += [f"unknown: {u}" for u in n["unknown"]] + [f"skipped: {s}" for s in n["skipped"]]
        if n["lemon"]:
            lines.append(f"lemon: {n['lemon']['reason']}")
        if n["status"] == "fail":
            first = next(f for f in n["findings"] if f["severity"] == "fail")
            ET.SubElement(case, "failure", message=f"{first['code']} {first['name']} {first['subject']}",
                          type=first["code"]).text = "\n".join(lines)
        elif n["status"] == "unknown":
            ET.SubElement(case, "error", message=n["unknown"][0], type="unknown").text = "\n".join(lines)
        ET.SubElement(case, "system-out").text = "\n".join(lines)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_reports(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "inspect.json", out_dir / "inspect.html", out_dir / "inspect.junit.xml"]
    paths[0].write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    paths[1].write_text(to_html(doc))
    paths[2].write_text(to_junit(doc))
    return paths
