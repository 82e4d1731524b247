"""Load the fault catalog: every YAML file under a data directory, validated, cross-checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.catalog.model import Fault
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import problems_from_validation, read_yaml
from gpufleet.core.taxonomy import FaultClass

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Catalog:
    faults: tuple[Fault, ...]
    sources: dict[str, str] = field(default_factory=dict)  # fault id -> file it came from

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def get(self, fault_id: str) -> Fault:
        for f in self.faults:
            if f.id == fault_id:
                return f
        known = ", ".join(sorted(f.id for f in self.faults))
        raise KeyError(f"no fault {fault_id!r} in the catalog; known: {known}")

    def by_xid(self) -> dict[int, Fault]:
        return {f.xid: f for f in self.faults if f.xid is not None}

    def by_alert(self) -> dict[str, Fault]:
        return {f.alert.name: f for f in self.faults if f.alert is not None}

    def of_class(self, cls: FaultClass) -> list[Fault]:
        return [f for f in self.faults if f.fault_class is cls]


def parse_catalog_file(path: Path) -> list[Fault]:
    """Parse one catalog file (`faults: [...]`); raises InputError with every problem."""
    doc: Any = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("faults"), list):
        raise InputError(str(path), [Problem("faults", "a catalog file needs a top-level `faults:` list")])
    extra = sorted(set(doc) - {"faults"})
    problems = [Problem(k, "unknown key") for k in extra]
    faults = []
    for i, entry in enumerate(doc["faults"]):
        try:
            faults.append(Fault.model_validate(entry))
        except ValidationError as e:
            problems += problems_from_validation(e, ["faults", i])
    if problems:
        raise InputError(str(path), problems)
    return faults


def cross_check(faults: list[tuple[str, int, Fault]]) -> dict[str, list[Problem]]:
    """Problems that span entries (duplicates, dangling references), keyed by file."""
    out: dict[str, list[Problem]] = {}

    def add(file: str, i: int, where: str, msg: str) -> None:
        out.setdefault(file, []).append(Problem(f"faults[{i}].{where}", msg))

    ids = Counter(f.id for _, _, f in faults)
    alerts = Counter(f.alert.name for _, _, f in faults if f.alert)
    xids = Counter(f.xid for _, _, f in faults if f.xid is not None)
    known = set(ids)
    for file, i, f in faults:
        if ids[f.id] > 1:
            add(file, i, "id", f"duplicate fault id {f.id}")
        if f.alert and alerts[f.alert.name] > 1:
            add(file, i, "alert.name", f"duplicate alert name {f.alert.name}")
        if f.xid is not None and xids[f.xid] > 1:
            add(file, i, "xid", f"XID {f.xid} is declared by more than one fault")
        for ref in f.dedup.secondary_to if f.dedup else []:
            if ref != "any" and ref not in known:
                add(file, i, "dedup.secondaryTo", f"unknown fault id {ref}")
    return out


def load_catalog(data_dir: Path | str = DATA_DIR) -> Catalog:
    """Load every `*.yaml` under data_dir. Raises InputError (first file with problems)."""
    files = sorted(Path(data_dir).glob("*.yaml"))
    if not files:
        raise InputError(str(data_dir), [Problem("(directory)", "no catalog files (*.yaml)")])
    entries: list[tuple[str, int, Fault]] = []
    for path in files:
        entries += [(str(path), i, f) for i, f in enumerate(parse_catalog_file(path))]
    for file, problems in cross_check(entries).items():
        raise InputError(file, problems)
    return Catalog(tuple(f for _, _, f in entries), {f.id: file for file, _, f in entries})
