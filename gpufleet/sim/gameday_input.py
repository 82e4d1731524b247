"""Measured recovery times from a game-day report's JSON summary (`--from-report`).

The report is read through the model the game-day writes it with (gpufleet.core.gameday_summary,
docs/simulator.md "Game-day report input"): per experiment `fault_class` and `measured`
(`detect_seconds`, `isolate_seconds`, `recover_seconds`, seconds from the fault); null is "not
measured"; unknown keys are errors, with their path. Several experiments of one class: each fault
of the projection draws one experiment's times (the measured distribution); the medians are
recorded as the class's summary.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.core.errors import InputError, Problem
from gpufleet.core.gameday_summary import SummaryDoc
from gpufleet.core.taxonomy import FaultClass


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
    # experiments whose job recovered before the fault was detected or isolated: their detect and
    # isolate times are counted up to the recovery (the job did not wait for them)
    recovered_first: tuple[str, ...] = ()


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_report(doc: Any, file: str) -> dict[FaultClass, Measured]:
    try:
        summary = SummaryDoc.model_validate(doc)
    except ValidationError as e:
        raise InputError(file, [Problem(_path(err["loc"]), err["msg"]) for err in e.errors()]) from None
    problems: list[Problem] = []
    known = ", ".join(c.value for c in FaultClass)
    samples: dict[FaultClass, dict[str, list[float]]] = {}
    names: dict[FaultClass, list[str]] = {}
    triples: dict[FaultClass, list[tuple[float | None, float | None, float | None]]] = {}
    early: dict[FaultClass, list[str]] = {}  # experiments that recovered before detect/isolate
    for i, exp in enumerate(summary.experiments):
        where = f"experiments[{i}]"
        m = exp.measured
        values = {k: v for k, v in (("detect", m.detect_seconds), ("isolate", m.isolate_seconds),
                                    ("recover", m.recover_seconds)) if v is not None}
        if exp.fault_class is None:
            if values:
                problems.append(Problem(f"{where}.fault_class", "measured times need the fault class"))
            continue  # an experiment that never ran far enough to be classified
        try:
            cls = FaultClass(exp.fault_class)
        except ValueError:
            problems.append(
                Problem(f"{where}.fault_class", f"unknown fault class {exp.fault_class!r}; known: {known}"))
            continue
        hpath = f"{where}.measured"
        if "detect" in values and "isolate" in values and values["isolate"] < values["detect"]:
            problems.append(
                Problem(hpath, "isolate_seconds is before detect_seconds (both count from the fault)"))
            continue
        if "recover" in values and values["recover"] < max(values.get("isolate", 0.0),
                                                           values.get("detect", 0.0)):
            # The job came back before the fault was detected or isolated (a link flap shorter
            # than the collective's retries, as measured by the game-day): it did not wait for
            # them, so they count up to the recovery, and the projection's restart floor is 0.
            for name in ("detect", "isolate"):
                if name in values:
                    values[name] = min(values[name], values["recover"])
            early.setdefault(cls, []).append(exp.name)
        if not values:
            continue  # an experiment that measured nothing (e.g. it was aborted): nothing to use
        for name, v in values.items():
            samples.setdefault(cls, {}).setdefault(name, []).append(v)
        triples.setdefault(cls, []).append(
            (values.get("detect"), values.get("isolate"), values.get("recover")))
        names.setdefault(cls, []).append(exp.name)
    if problems:
        raise InputError(file, problems)
    if not samples:
        raise InputError(file, [Problem("experiments", "no experiment has a measured time")])

    def med(cls: FaultClass, name: str) -> float | None:
        vals = samples[cls].get(name)
        return float(statistics.median(vals)) if vals else None

    return {
        cls: Measured(cls, med(cls, "detect"), med(cls, "isolate"), med(cls, "recover"),
                      tuple(names[cls]), tuple(triples[cls]), tuple(early.get(cls, ())))
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
