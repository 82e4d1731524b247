"""`promtool test rules` files generated for every alert of the catalog.

The input series of each alert are hand-written fixtures (`notes/alert_tests.yaml`): a series set
that makes the alert fire (with the time `onset` at which its expression first holds) and a
healthy series set. From them and the rule, each alert gets the cases the monitoring-mixin style
asks for (conventions.md): silent just before onset, still silent (pending) just before its `for:`
elapses, firing after with exact labels and annotations, and a negative case that stays silent.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Fault
from gpufleet.catalog.rules import DOMAINS, RULES_FILE, alert_rule, domain_of, fmt_duration, seconds
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import load_yaml_model

FIXTURES_FILE = Path(__file__).parent / "notes" / "alert_tests.yaml"
TESTS_DIR = "monitoring/tests"
EVAL_INTERVAL_S = 60  # every fixture's series use a 1m step, and rules are evaluated every 1m
_DURATION = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")
_LABEL_SET = re.compile(r"@([A-Za-z0-9_]+)")
_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_VALUE_FORMS = ("$value", "$value | humanize", "$value | humanizePercentage")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              frozen=True)


class SeriesSpec(_M):
    series: str  # may name a label set of the file as @name, e.g. DCGM_FI_DEV_GPU_TEMP{@gpu}
    values: str  # promtool expanding notation, one sample per minute


class AlertFixture(_M):
    onset: Annotated[str, Field(pattern=_DURATION.pattern)]  # first evaluation where expr holds
    fires: Annotated[list[SeriesSpec], Field(min_length=1)]
    labels: dict[str, str]  # labels the expression yields (the rule's own labels are added)
    value: str | None = None  # `{{ $value ... }}` as rendered at the firing evaluation
    also_at: list[Annotated[str, Field(pattern=_DURATION.pattern)]] = Field(default_factory=list)
    # Evaluations after the fault was remediated (the series in `fires` say how): silent again.
    clears_at: list[Annotated[str, Field(pattern=_DURATION.pattern)]] = Field(default_factory=list)
    healthy: Annotated[list[SeriesSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _onset_after_start(self) -> AlertFixture:
        if seconds(self.onset) < EVAL_INTERVAL_S:
            raise ValueError("onset must be at least 1m, so that the alert can be silent before it")
        return self


class Fixtures(_M):
    label_sets: dict[str, str] = Field(default_factory=dict)
    alerts: dict[str, AlertFixture]


def load_fixtures(path: Path = FIXTURES_FILE) -> Fixtures:
    return load_yaml_model(path, Fixtures)


def render(template: str, labels: dict[str, str], value: str | None) -> str:
    """Render the subset of Prometheus' Go templates our annotations use: `{{ $labels.x }}` (a
    missing label renders empty, as Go does for map[string]string) and `{{ $value }}` with an
    optional humanize / humanizePercentage, whose rendering the fixture states."""

    def sub(m: re.Match[str]) -> str:
        expr = m.group(1)
        if expr.startswith("$labels."):
            return labels.get(expr.removeprefix("$labels."), "")
        if expr in _VALUE_FORMS:
            if value is None:
                raise ValueError(f"the description uses {{{{ {expr} }}}}: give the fixture a value")
            return value
        raise ValueError(f"template construct not supported by the test generator: {{{{ {expr} }}}}")

    return _TEMPLATE.sub(sub, template)


def _series(specs: list[SeriesSpec], label_sets: dict[str, str]) -> list[dict[str, str]]:
    out = []
    for s in specs:
        unknown = sorted(set(_LABEL_SET.findall(s.series)) - set(label_sets))
        if unknown:
            raise ValueError(f"unknown label set(s) {unknown} in {s.series!r}")
        text = _LABEL_SET.sub(lambda m: label_sets[m.group(1)], s.series)
        out.append({"series": text, "values": s.values})
    return out


def alert_tests(fault: Fault, fx: AlertFixture, label_sets: dict[str, str]) -> list[dict[str, Any]]:
    """The promtool test cases of one alert."""
    rule = alert_rule(fault)
    name = rule["alert"]
    onset = seconds(fx.onset)
    wait = math.ceil(seconds(rule["for"]) / EVAL_INTERVAL_S) * EVAL_INTERVAL_S
    fire = onset + wait
    labels = {**fx.labels, **rule["labels"]}
    annotations = {
        k: render(v, fx.labels, fx.value) for k, v in rule["annotations"].items()
    }
    expected = [{"exp_labels": labels, "exp_annotations": annotations}]
    checks: list[dict[str, Any]] = [
        {"eval_time": fmt_duration(onset - EVAL_INTERVAL_S), "alertname": name, "exp_alerts": []},
    ]
    if wait:
        pending = fmt_duration(fire - EVAL_INTERVAL_S)
        checks.append({"eval_time": pending, "alertname": name, "exp_alerts": []})
    checks.append({"eval_time": fmt_duration(fire), "alertname": name, "exp_alerts": expected})
    # With a $value in the description, alsoAt states that the value is the same then (promtool
    # compares the rendered annotation, so a different value fails the test).
    for t in fx.also_at:
        checks.append({"eval_time": t, "alertname": name, "exp_alerts": expected})
    for t in fx.clears_at:
        checks.append({"eval_time": t, "alertname": name, "exp_alerts": []})
    return [
        {
            "name": f"{name}: silent before onset and for:, fires after with exact labels and annotations",
            "interval": fmt_duration(EVAL_INTERVAL_S),
            "input_series": _series(fx.fires, label_sets),
            "alert_rule_test": checks,
        },
        {
            "name": f"{name}: negative case stays silent",
            "interval": fmt_duration(EVAL_INTERVAL_S),
            "input_series": _series(fx.healthy, label_sets),
            "alert_rule_test": [{"eval_time": fmt_duration(fire), "alertname": name, "exp_alerts": []}],
        },
    ]


def missing_fixtures(catalog: Catalog, fixtures: Fixtures) -> tuple[list[str], list[str]]:
    """(alerts without a fixture, fixtures without an alert)."""
    alerts = set(catalog.by_alert())
    return sorted(alerts - set(fixtures.alerts)), sorted(set(fixtures.alerts) - alerts)


def test_files(catalog: Catalog, fixtures: Fixtures) -> dict[str, dict[str, Any]]:
    """`monitoring/tests/<domain>.test.yaml` documents, keyed by path relative to the repository."""
    no_fixture, orphans = missing_fixtures(catalog, fixtures)
    problems = [Problem(f"alerts.{a}", "no promtool fixture for this alert") for a in no_fixture]
    problems += [Problem(f"alerts.{a}", "fixture for an alert the catalog does not have") for a in orphans]
    if problems:
        raise InputError(str(FIXTURES_FILE), problems)
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for fault in catalog:
        if fault.alert is None:
            continue
        cases = alert_tests(fault, fixtures.alerts[fault.alert.name], fixtures.label_sets)
        by_domain.setdefault(domain_of(fault, catalog), []).extend(cases)
    rules_rel = Path("../rules") / Path(RULES_FILE).name
    out = {}
    for d in [d for d in DOMAINS if d in by_domain] + sorted(set(by_domain) - set(DOMAINS)):
        out[f"{TESTS_DIR}/{d}.test.yaml"] = {
            "rule_files": [str(rules_rel)],
            "evaluation_interval": fmt_duration(EVAL_INTERVAL_S),
            "tests": by_domain[d],
        }
    return out
