"""Measured recovery times from a game-day report's JSON summary (`--from-report`).

Read fields (docs/simulator.md, "Game-day report input"): a top-level object with an `experiments`
list (a bare list is accepted too); per experiment `fault_class` (or `faultClass`) and the measured
seconds from the fault, `detect_seconds`, `isolate_seconds`, `recover_seconds` (camelCase accepted),
either on the experiment or inside its `measured` object. Missing or null values are "not
measured". Other keys are ignored, so the report may grow. Several experiments of one class: each
fault of the projection draws one experiment's times (the measured distribution); the medians are
recorded as the class's summary.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.core.errors import InputError, Problem
from gpufleet.core.taxonomy import FaultClass

_FIELDS = {
    "detect": ("detect_seconds", "detectSeconds"),
    "isolate": ("isolate_seconds", "isolateSeconds"),
    "recover": ("recover_seconds", "recoverSeconds"),
}


@dataclass(frozen=True)
class Measured:
    """Median measured seconds from the fault, per class (None: not measured)."""

    fault_class: FaultClass
    detect_seconds: float | None
    isolate_seconds: float | None
    recover_seconds: float | None
    experiments: tuple[str, ...]
    # every experiment's own (detect, isolate, recover) seconds from the fault (None: not measured),
    # in report order: the measured distribution the projection draws from
    samples: tuple[tuple[float | None, float | None, float | None], ...] = ()


def _number(value: Any, path: str, problems: list[Problem]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        problems.append(Problem(path, f"must be a number of seconds >= 0 or null (got {value!r})"))
        return None
    return float(value)


def parse_report(doc: Any, file: str) -> dict[FaultClass, Measured]:
    problems: list[Problem] = []
    if isinstance(doc, dict):
        exps = doc.get("experiments")
        if not isinstance(exps, list):
            raise InputError(
                file, [Problem("experiments", "a game-day report needs an `experiments` list")])
        base = "experiments"
    elif isinstance(doc, list):
        exps, base = doc, ""
    else:
        raise InputError(file, [Problem("(top level)", "expected an object with `experiments` or a list")])
    known = ", ".join(c.value for c in FaultClass)
    samples: dict[FaultClass, dict[str, list[float]]] = {}
    names: dict[FaultClass, list[str]] = {}
    triples: dict[FaultClass, list[tuple[float | None, float | None, float | None]]] = {}
    for i, exp in enumerate(exps):
        where = f"{base}[{i}]"
        if not isinstance(exp, dict):
            problems.append(Problem(where, "an experiment must be an object"))
            continue
        raw_cls = exp.get("fault_class", exp.get("faultClass"))
        if raw_cls is None:
            measured = exp.get("measured")
            if isinstance(measured, dict) and all(measured.get(k) is None for ks in _FIELDS.values()
                                                  for k in ks):
                continue  # an experiment that ran nothing classifiable (e.g. failed to start)
            problems.append(Problem(f"{where}.fault_class", "required key is missing"))
            continue
        try:
            cls = FaultClass(raw_cls)
        except ValueError:
            problems.append(
                Problem(f"{where}.fault_class", f"unknown fault class {raw_cls!r}; known: {known}"))
            continue
        holder, hpath = exp, where
        if "measured" in exp:
            if not isinstance(exp["measured"], dict):
                problems.append(Problem(f"{where}.measured", "must be an object of seconds"))
                continue
            holder, hpath = exp["measured"], f"{where}.measured"
        values: dict[str, float] = {}
        for name, keys in _FIELDS.items():
            for key in keys:
                if key in holder:
                    v = _number(holder[key], f"{hpath}.{key}", problems)
                    if v is not None:
                        values[name] = v
                    break
        if "detect" in values and "isolate" in values and values["isolate"] < values["detect"]:
            problems.append(
                Problem(hpath, "isolate_seconds is before detect_seconds (both count from the fault)"))
            continue
        before = max(values.get("isolate", 0.0), values.get("detect", 0.0))
        if "recover" in values and values["recover"] < before:
            problems.append(
                Problem(hpath, "recover_seconds is before detection/isolation (all count from the fault)"))
            continue
        if not values:
            continue  # an experiment that measured nothing (e.g. it was aborted): nothing to use
        for name, v in values.items():
            samples.setdefault(cls, {}).setdefault(name, []).append(v)
        triples.setdefault(cls, []).append(
            (values.get("detect"), values.get("isolate"), values.get("recover")))
        names.setdefault(cls, []).append(str(exp.get("name", exp.get("experiment", where))))
    if problems:
        raise InputError(file, problems)
    if not samples:
        raise InputError(file, [Problem(base or "(top level)", "no experiment has a measured time")])

    def med(cls: FaultClass, name: str) -> float | None:
        vals = samples[cls].get(name)
        return float(statistics.median(vals)) if vals else None

    return {
        cls: Measured(cls, med(cls, "detect"), med(cls, "isolate"), med(cls, "recover"),
                      tuple(names[cls]), tuple(triples[cls]))
        for cls in samples
    }


def load_report(path: Path | str) -> dict[FaultClass, Measured]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(str(p), [Problem("(file)", f"cannot read: {e.strerror}")]) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
        raise InputError(str(p), [Problem(where, f"invalid JSON: {e.msg}")]) from None
    return parse_report(doc, str(p))
