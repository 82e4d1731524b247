"""The experiment suite: which Chaos Toolkit experiment files a game-day runs (pure over files).

An experiment joins the default suite of a backend when its `tags` contain the backend's name
(`"sandbox"`, `"slurm"`, `"kubernetes"`).

What the verdict expects of the fault (isolation, interruption) has one home: the arguments of the
steady-state probe `recovery_within_budget`, which judges the run inside `chaos run` and returns
the verdict into the journal (the game-day reads it there); an argument left out (or null) is the
fault class's default (`FaultClass.isolates_node` / `interrupts_training`). The probe comes first
in the hypothesis (so it runs, and writes the verdict, even when another probe deviates) with the
tolerance `BUDGET_TOLERANCE` (its verdict's outcome is PASS).

Which verdict the game-day expects: PASS, or FAIL for a breach test, marked by the tag
`expect-deviation` or by the experiment's `extensions` entry named `gpufleet` (the experiment
format's place for tool-specific data, so `chaos run` ignores it):

    "extensions": [{"name": "gpufleet", "expect_outcome": "FAIL", "order": 10}]

expect_outcome: "PASS" (default) or "FAIL" (a breach test: the verdict must be FAIL).
order: sort key within the suite (then the file name); default 100.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.chaos.workload.probes import BUDGET_TOLERANCE
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import read_json
from gpufleet.gameday.contract import BUDGET_PROBE, calls
from gpufleet.slo import Outcome

EXTENSION = "gpufleet"
EXPECT_DEVIATION_TAG = "expect-deviation"
# An experiment that misses its target for a known, documented reason outside the platform's
# control (docs/chaos.md "Known failures"): runnable by name with --experiments, left out of the
# default suite so that `make gameday` judges what the platform can meet. Never a pass.
KNOWN_ISSUE_TAG = "known-issue"
_EXT_KEYS = {"name", "expect_outcome", "order"}
_MOVED = {"expect_isolation", "expect_interruption"}  # now only arguments of the budget probe


@dataclass(frozen=True)
class Expectations:
    isolation: bool | None = None  # the budget probe's argument; None: the fault class's default
    interruption: bool | None = None  # likewise
    outcome: Outcome = Outcome.PASS  # the verdict the game-day expects


@dataclass(frozen=True)
class Experiment:
    """One experiment file, as far as the game-day needs it."""

    name: str  # file stem, e.g. "gpu-xid-79"
    path: Path
    title: str
    tags: tuple[str, ...]
    configuration: dict[str, Any]
    expect: Expectations = field(default_factory=Expectations)
    order: int = 100
    rollbacks: int = 0  # rollback activities declared
    fault_ids: tuple[str, ...] = ()  # the catalog faults its method injects (fault_id_of)

    @property
    def gpu_vendors(self) -> frozenset[str]:
        """The accelerator vendors its faults need (catalog Fault.gpu_vendor); empty: any node."""
        out = set()
        for fid in self.fault_ids:
            try:
                vendor = catalog().get(fid).gpu_vendor
            except (KeyError, InputError):
                continue
            if vendor is not None:
                out.add(vendor)
        return frozenset(out)

    @property
    def fault_class(self) -> str | None:
        """`gpufleet_fault_class` when the experiment sets it (the chaos extension checks that it
        agrees with the fault's), else the class of the first fault its method injects."""
        value = self.configuration.get("gpufleet_fault_class")
        if isinstance(value, str):
            return value
        for fid in self.fault_ids:
            try:
                return catalog().get(fid).fault_class.value
            except (KeyError, InputError):
                continue
        return None


def parse_experiment(path: Path, doc: Any) -> Experiment:
    """Validate the parts of an experiment the game-day reads; every problem at once."""
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise InputError(str(path), [Problem("(top level)", "an experiment is a JSON object")])
    title = doc.get("title")
    if not isinstance(title, str) or not title:
        problems.append(Problem("title", "required, a non-empty string"))
    tags = doc.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        problems.append(Problem("tags", "must be a list of strings"))
        tags = []
    config = doc.get("configuration", {})
    if not isinstance(config, dict):
        problems.append(Problem("configuration", "must be a mapping"))
        config = {}
    rollbacks = doc.get("rollbacks", [])
    if not isinstance(rollbacks, list):
        problems.append(Problem("rollbacks", "must be a list"))
        rollbacks = []
    base = _from_hypothesis(doc.get("steady-state-hypothesis"), problems)
    if EXPECT_DEVIATION_TAG in tags:
        base = dataclasses.replace(base, outcome=Outcome.FAIL)
    expect, order = _expectations(doc.get("extensions", []), problems, base)
    if problems:
        raise InputError(str(path), problems)
    method = doc.get("method", [])
    fault_ids = tuple(f for a in (method if isinstance(method, list) else []) if (f := fault_id_of(a)))
    return Experiment(
        name=path.stem, path=path, title=str(title), tags=tuple(tags), configuration=dict(config),
        expect=expect, order=order, rollbacks=len(rollbacks), fault_ids=fault_ids,
    )


@functools.cache
def catalog() -> Catalog:
    """The packaged catalog, read once per process (experiments name faults in it)."""
    return load_catalog()


def fault_id_of(activity: Any) -> str | None:
    """The catalog fault an activity injects: its `fault_id` argument, else the default of the
    activity function's `fault_id` parameter (crash_node injects node-crash). None for probes and
    activities that inject no catalog fault."""
    if not isinstance(activity, dict) or activity.get("type") != "action":
        return None
    provider = activity.get("provider")
    if not isinstance(provider, dict) or provider.get("type") != "python":
        return None
    args = provider.get("arguments") or {}
    if isinstance(args, dict) and isinstance(args.get("fault_id"), str):
        return str(args["fault_id"])
    module, func = provider.get("module"), provider.get("func")
    if not (isinstance(module, str) and module.startswith("gpufleet.") and isinstance(func, str)):
        return None
    try:
        fn = getattr(importlib.import_module(module), func)
        default = inspect.signature(fn).parameters["fault_id"].default
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return None
    return default if isinstance(default, str) else None


def _from_hypothesis(hypothesis: Any, problems: list[Problem]) -> Expectations:
    """Expectations given to the `recovery_within_budget` steady-state probe."""
    probes = hypothesis.get("probes", []) if isinstance(hypothesis, dict) else []
    for i, probe in enumerate(probes if isinstance(probes, list) else []):
        if not calls(probe, BUDGET_PROBE):
            continue
        where = f"steady-state-hypothesis.probes[{i}]"
        if i != 0:
            problems.append(Problem(where, f"{BUDGET_PROBE} must be the first probe: chaoslib stops the "
                                    "hypothesis at the first deviation, and the verdict must be written"))
        if probe.get("tolerance") != BUDGET_TOLERANCE:
            problems.append(Problem(f"{where}.tolerance", f"must be {json.dumps(BUDGET_TOLERANCE)} (the "
                                    "probe returns the verdict; the hypothesis holds when it is a PASS)"))
        args = probe["provider"].get("arguments") or {}
        at = f"{where}.provider.arguments"
        if not isinstance(args, dict):
            problems.append(Problem(at, "must be a mapping"))
            return Expectations()
        iso, intr = args.get("expect_isolation"), args.get("expect_interruption")
        for key, value in (("expect_isolation", iso), ("expect_interruption", intr)):
            if value is not None and not isinstance(value, bool):
                problems.append(
                    Problem(f"{at}.{key}", "must be true, false or null (the fault class's default)")
                )
        return Expectations(
            iso if isinstance(iso, bool) else None, intr if isinstance(intr, bool) else None
        )
    return Expectations()


def _expectations(
    extensions: Any, problems: list[Problem], base: Expectations
) -> tuple[Expectations, int]:
    if not isinstance(extensions, list):
        problems.append(Problem("extensions", "must be a list"))
        return base, 100
    ours = [(i, e) for i, e in enumerate(extensions) if isinstance(e, dict) and e.get("name") == EXTENSION]
    if not ours:
        return base, 100
    if len(ours) > 1:
        problems.append(Problem("extensions", f"more than one extension named {EXTENSION!r}"))
    i, ext = ours[0]
    at = f"extensions[{i}]"
    known = ", ".join(sorted(_EXT_KEYS - {"name"}))
    for key in sorted(set(ext) - _EXT_KEYS):
        if key in _MOVED:
            problems.append(Problem(f"{at}.{key}", f"give {key} as an argument of the steady-state probe "
                                    f"{BUDGET_PROBE} (chaos run judges with it too)"))
        else:
            problems.append(Problem(f"{at}.{key}", f"unknown key; known: {known}"))
    outcome = base.outcome
    if "expect_outcome" in ext:
        if ext["expect_outcome"] in ("PASS", "FAIL"):
            outcome = Outcome(ext["expect_outcome"])
        else:
            problems.append(Problem(f"{at}.expect_outcome", "must be PASS or FAIL"))
    order = ext.get("order", 100)
    if not isinstance(order, int) or isinstance(order, bool):
        problems.append(Problem(f"{at}.order", "must be an integer"))
        order = 100
    return dataclasses.replace(base, outcome=outcome), order


def load_experiment(path: Path) -> Experiment:
    return parse_experiment(path, read_json(path))


def select(
    experiments: list[Experiment], backend: str, names: list[str] | None,
    vendors: frozenset[str] | None = None,
) -> list[Experiment]:
    """The suite: the named experiments in the order given, else every one tagged for `backend`,
    not tagged `known-issue` and whose faults can happen on the stack's accelerators (`vendors`;
    None: any), sorted by (order, name). Unknown names are an input error listing what exists; a
    named experiment of another vendor's faults is one too (it could only fail at injection)."""
    by_name = {e.name: e for e in experiments}
    if names:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            known = ", ".join(sorted(by_name)) or "none"
            raise InputError(
                "--experiments", [Problem(n, f"no experiment file {n}.json; known: {known}") for n in unknown]
            )
        wrong = [by_name[n] for n in names if not fits(by_name[n], vendors)]
        if wrong and vendors is not None:
            have = ", ".join(sorted(vendors))
            raise InputError("--experiments", [
                Problem(e.name, f"injects faults of {', '.join(sorted(e.gpu_vendors))} accelerators; "
                                f"the stack has {have}") for e in wrong])
        return [by_name[n] for n in names]
    chosen = (e for e in experiments
              if backend in e.tags and KNOWN_ISSUE_TAG not in e.tags and fits(e, vendors))
    return sorted(chosen, key=lambda e: (e.order, e.name))


def fits(experiment: Experiment, vendors: frozenset[str] | None) -> bool:
    """Whether the experiment's faults can happen on accelerators of `vendors` (None: any)."""
    return vendors is None or experiment.gpu_vendors <= vendors


def left_out(experiments: list[Experiment], backend: str) -> list[str]:
    """Experiments for `backend` the default suite leaves out (tagged `known-issue`)."""
    return sorted(e.name for e in experiments if backend in e.tags and KNOWN_ISSUE_TAG in e.tags)


def discover(directory: Path) -> list[Experiment]:
    """Every `*.json` experiment in `directory` (not recursive), validated; problems of all
    files reported together."""
    found: list[Experiment] = []
    problems: list[Problem] = []
    for path in sorted(directory.glob("*.json")):
        try:
            found.append(load_experiment(path))
        except InputError as e:
            problems += [Problem(f"{path.name}: {p.path}", p.message) for p in e.problems]
    if problems:
        raise InputError(str(directory), problems)
    return found
