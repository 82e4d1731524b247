from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from gpufleet.gameday import Experiment, JournalFacts, SuiteRun, evaluate, summary_dict, write_report
from gpufleet.slo import Budget

Exp = Callable[[str], Experiment]
Facts = Callable[[str], JournalFacts]
NAMES = ("gpu-xid-79", "node-crash", "budget-breach", "inject-fails")


def suite(experiment: Exp, facts: Facts, budgets: dict[str, Budget], names: tuple[str, ...] = NAMES,
          planned: tuple[str, ...] = NAMES) -> SuiteRun:
    results = tuple(
        evaluate(experiment(n), facts(n), journal=f"journals/{n}.json", started_at=1.7e9 + i,
                 wall_seconds=30.0 + i)
        for i, n in enumerate(names)
    )
    return SuiteRun("sandbox", "sandbox", 1.7e9, 200.0, 40.0, results, planned=planned)


def test_summary_keys_the_simulator_reads(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    s = json.loads(json.dumps(summary_dict(suite(experiment, facts, budgets))))
    assert (s["schema"], s["stack"], s["outcome"]) == ("gpufleet.gameday/v1", "sandbox", "FAIL")
    assert s["exit_code"] == 1
    assert s["counts"] == {"met": 2, "missed": 1, "unjudged": 1}
    first = s["experiments"][0]
    assert first["fault_class"] == "gpu-fatal"
    assert first["measured"]["detect_seconds"] == 3.5
    assert first["measured"]["isolate_seconds"] == 4.25
    assert first["measured"]["recover_seconds"] == 31.0
    assert first["budget"] == {"detect_seconds": 15.0, "isolate_seconds": 15.0, "recover_seconds": 60.0,
                               "source": "stack"}
    assert (first["outcome"], first["result"], first["fault_id"]) == ("PASS", "met", "xid-79")
    assert [c["name"] for c in first["checks"]] == [
        "detect", "isolate", "recover", "steady-state", "rollbacks",
    ]
    assert first["timeline"]["fault_id"] == "xid-79"
    unjudged = s["experiments"][3]
    assert unjudged["measured"]["recover_seconds"] is None
    assert unjudged["outcome"] == "UNKNOWN"


def test_not_run_experiments_never_pass(experiment: Exp, facts: Facts, budgets: dict[str, Budget]) -> None:
    run = suite(experiment, facts, budgets, names=("gpu-xid-79",), planned=("gpu-xid-79", "node-crash"))
    s = summary_dict(run)
    assert (s["outcome"], s["exit_code"], s["not_run"]) == ("UNKNOWN", 3, ["node-crash"])
    ok = suite(experiment, facts, budgets, names=("gpu-xid-79",), planned=("gpu-xid-79",))
    assert (summary_dict(ok)["outcome"], ok.exit_code) == ("PASS", 0)


def test_junit_is_valid_with_one_testcase_per_experiment(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget], tmp_path: Path
) -> None:
    paths = write_report(suite(experiment, facts, budgets), tmp_path)
    root = ET.parse(paths["junit"]).getroot()
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == list(NAMES)
    failed = {c.get("name"): c.find("failure") for c in cases}
    assert failed["gpu-xid-79"] is None
    assert failed["budget-breach"] is None  # FAIL was the expected verdict
    node = failed["node-crash"]
    assert node is not None and node.get("type") == "FAIL"
    assert node.get("message") == (
        "missed: verdict FAIL, expected PASS; recover: the workload never resumed after the fault"
    )
    inj = failed["inject-fails"]
    assert inj is not None and inj.get("type") == "UNKNOWN"
    suite_el = root.find("testsuite")
    assert suite_el is not None and (suite_el.get("tests"), suite_el.get("failures")) == ("4", "2")
    assert cases[0].get("time") == "30.000"


def test_html_has_one_embedded_plot_per_experiment(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget], tmp_path: Path
) -> None:
    paths = write_report(suite(experiment, facts, budgets), tmp_path)
    html = paths["html"].read_text()
    pattern = r'<img class="timeline" alt="timeline of ([^"]+)" src="data:image/png;base64,([^"]+)"'
    images = re.findall(pattern, html)
    assert [name for name, _ in images] == list(NAMES)
    for _, data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    # The table shows measured / budget and the verdicts.
    assert '<td class="num PASS">31.0 / 60</td>' in html
    assert '<td class="num FAIL">31.0 / 20</td>' in html  # the breach test's recover check
    assert not re.search(r'(src|href)="https?://', html)  # a single file: nothing fetched
    assert (tmp_path / "summary.json").exists()


def test_html_escapes_text(experiment: Exp, facts: Facts, budgets: dict[str, Budget], tmp_path: Path) -> None:
    import dataclasses

    exp = dataclasses.replace(experiment("gpu-xid-79"), title="<script>alert(1)</script>")
    r = evaluate(exp, facts("gpu-xid-79"), journal=None, started_at=0.0, wall_seconds=1.0)
    html = write_report(SuiteRun("sandbox", "sandbox", 0.0, 1.0, 0.0, (r,)), tmp_path)["html"].read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_a_met_breach_test_is_shown_as_failed_as_expected(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget], tmp_path: Path
) -> None:
    run = suite(experiment, facts, budgets)
    by_name = {r.name: r for r in run.results}
    assert by_name["budget-breach"].result_label == "failed as expected"
    assert by_name["gpu-xid-79"].result_label == "met"
    assert by_name["node-crash"].result_label == "missed"
    s = summary_dict(run)
    assert s["failed_as_expected"] == ["budget-breach"]
    labels = [e["result_label"] for e in s["experiments"]]
    assert labels == ["met", "missed", "failed as expected", "unjudged"]
    paths = write_report(run, tmp_path)
    html = paths["html"].read_text()
    assert '<td class="expected-failure">failed as expected</td>' in html
    assert html.count("Breach test: the budget below is set too tight") == 1
    cases = ET.parse(paths["junit"]).getroot().iter("testcase")
    case = next(c for c in cases if c.get("name") == "budget-breach")
    out = case.find("system-out")
    assert case.find("failure") is None and out is not None and (out.text or "").startswith(
        "result: failed as expected (verdict FAIL, expected FAIL)")


def test_an_experiment_under_load_gets_its_serving_plot_and_readable_figures(
    experiment: Exp, facts: Facts, budgets: dict[str, Budget], tmp_path: Path
) -> None:
    import dataclasses

    from gpufleet.slo import Check, EventKind, Outcome
    from gpufleet.slo.run import judge_serving
    from gpufleet.slo.serving import RequestRecord, ServingRun, ServingTargets, bin_records

    base = suite(experiment, facts, budgets, names=("gpu-xid-79",), planned=("gpu-xid-79",))
    r = base.results[0]
    assert r.timeline is not None
    t0 = next(e.at for e in r.timeline.events if e.kind is EventKind.INJECTED) - 5
    records = [RequestRecord(t0 + s + i / 10, 0.03, s != 6) for s in range(20) for i in range(10)]
    checks, figures = judge_serving(ServingRun(bin_records(records, t0), ServingTargets(0.999, 500, 10),
                                               "http://10.76.0.1:8080"), r.timeline)
    loaded = dataclasses.replace(r, serving=figures, checks=(*r.checks, *checks))
    paths = write_report(dataclasses.replace(base, results=(loaded,)), tmp_path)
    html = paths["html"].read_text()
    found = re.findall(r'alt="serving load of gpu-xid-79" src="data:image/png;base64,([^"]+)"', html)
    assert len(found) == 1 and base64.b64decode(found[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Under load (http://10.76.0.1:8080)" in html
    by_name: dict[str, Check] = {c.name: c for c in checks}
    assert by_name["serving-availability"].outcome is Outcome.FAIL  # 10 of 200 failed
    row = '<td>serving-availability</td>\n<td class="num">95.000%</td>\n<td class="num">&gt;= 99.90%</td>'
    assert row in html
    assert '<td class="num">&lt;= 500 ms</td>' in html
