"""JUnit XML for CI: one testcase per experiment; a testcase fails unless its expectation was met
(a missed target, an unjudged run, a failed rollback)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from gpufleet.gameday.evaluate import Result
from gpufleet.gameday.report.summary import SuiteRun
from gpufleet.slo import Outcome


def junit_xml(run: SuiteRun) -> str:
    failures = sum(1 for r in run.results if r.result is not Result.MET)
    suites = ET.Element("testsuites", name="gpufleet-gameday", tests=str(len(run.results)),
                        failures=str(failures), errors="0", time=f"{run.wall_seconds:.3f}")
    suite = ET.SubElement(
        suites, "testsuite", name=f"gameday.{run.stack}", tests=str(len(run.results)),
        failures=str(failures), errors="0", skipped="0", time=f"{run.wall_seconds:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (("stack", run.stack), ("backend", run.backend), ("outcome", run.outcome)):
        ET.SubElement(props, "property", name=name, value=value)
    for r in run.results:
        case = ET.SubElement(suite, "testcase", classname=f"gameday.{run.stack}.{r.fault_class or 'unknown'}",
                             name=r.name, time=f"{r.wall_seconds:.3f}")
        lines = [f"result: {r.result_label} (verdict {r.verdict.value}, expected {r.expected.value})"]
        lines += [f"{c.name}: {c.outcome.value} - {c.detail}" for c in r.checks]
        lines += [f"note: {n}" for n in r.notes]
        if r.result is not Result.MET:
            bad = [c for c in r.checks if c.outcome is not Outcome.PASS]
            first = bad[0] if bad else None
            message = (
                f"{r.result.value}: verdict {r.verdict.value}, expected {r.expected.value}"
                + (f"; {first.name}: {first.detail}" if first else "")
            )
            fail = ET.SubElement(case, "failure", message=message, type=r.outcome.value)
            fail.text = "\n".join(lines)
        out = ET.SubElement(case, "system-out")
        out.text = "\n".join(lines + ([f"journal: {r.journal}"] if r.journal else []))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
