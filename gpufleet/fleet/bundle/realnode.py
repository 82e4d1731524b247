"""The real-node collector table (realnode.yaml) and the pure functions that turn it into argv.

A node's plan is its vendor's section, its fabric's, the kernel's, its scheduler's, and the agents of
its vendor: each entry's placeholders filled, `per: ifname|device` entries repeated per interface
or accelerator, and `default: false` entries only when asked for by name.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.core.errors import InputError, Problem, format_path

TABLE = Path(__file__).with_name("realnode.yaml")
VENDORS = ("nvidia", "amd", "ascend")
FABRICS = {"infiniband": "infiniband", "roce": "roce", "efa": None}  # EFA: no table yet (docs)
SCHEDULERS = {"slurm": "slurm", "volcano": "kubernetes", "kueue": "kubernetes", "kubernetes": "kubernetes"}
PLACEHOLDERS = frozenset({"workdir", "since", "node", "ifname", "device"})


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    member: str
    argv: list[str] = Field(min_length=1)
    produces: str | None = None
    per: Literal["ifname", "device"] | None = None
    default: bool = True
    why: str | None = None  # why an entry is not run by default
    vendor: str | None = None  # an agents entry that applies to one vendor only
    source: str = Field(min_length=10)

    @model_validator(mode="after")
    def _check(self) -> Entry:
        used = {f for text in (*self.argv, self.member, self.produces or "")
                for _, f, _, _ in string.Formatter().parse(text) if f}
        unknown = used - PLACEHOLDERS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}")
        if self.per is not None and "{" + self.per + "}" not in self.member:
            raise ValueError(f"per: {self.per} needs {{{self.per}}} in member, else the members collide")
        if not self.default and not self.why:
            raise ValueError("default: false needs `why`")
        return self


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nvidia: list[Entry]
    amd: list[Entry]
    ascend: list[Entry]
    infiniband: list[Entry]
    roce: list[Entry]
    kernel: list[Entry]
    slurm: list[Entry]
    kubernetes: list[Entry]
    agents: list[Entry]


def parse_table(text: str, where: str) -> Table:
    """The table, or InputError naming every bad entry by its path."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(where, [Problem("(file)", f"not YAML: {e}")]) from None
    try:
        return Table.model_validate(raw)
    except ValidationError as e:
        problems = [Problem(format_path(err["loc"]), err["msg"]) for err in e.errors()]
        raise InputError(where, problems) from None


@cache
def load_table(path: Path = TABLE) -> Table:
    return parse_table(path.read_text(), str(path))


@dataclass(frozen=True)
class NodeFacts:
    """What the plan needs to know about the node."""

    node: str
    vendor: str
    fabric: str
    scheduler: str
    since: float  # unix seconds: logs from here on
    workdir: Path  # scratch folder for commands that write files
    ifnames: tuple[str, ...] = ()
    devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Planned:
    name: str
    member: str
    argv: list[str]
    produces: Path | None
    source: str


def sections(facts: NodeFacts) -> list[str]:
    """The table's sections that apply to the node; unknown vendor/fabric/scheduler -> ValueError."""
    problems = []
    if facts.vendor not in VENDORS:
        problems.append(f"vendor {facts.vendor!r} is not one of {list(VENDORS)}")
    if facts.fabric not in FABRICS:
        problems.append(f"fabric {facts.fabric!r} is not one of {sorted(FABRICS)}")
    if facts.scheduler not in SCHEDULERS:
        problems.append(f"scheduler {facts.scheduler!r} is not one of {sorted(SCHEDULERS)}")
    if problems:
        raise ValueError("; ".join(problems))
    out = [facts.vendor]
    fabric = FABRICS[facts.fabric]
    if fabric is not None:
        out.append(fabric)
    return [*out, "kernel", SCHEDULERS[facts.scheduler], "agents"]


def fill(text: str, values: Mapping[str, str]) -> str:
    return text.format_map(values)


def expand(entry: Entry, facts: NodeFacts) -> list[Planned]:
    """One entry's argv for this node: once, or once per interface / accelerator."""
    base = {"workdir": str(facts.workdir), "since": f"{int(facts.since)}", "node": facts.node}
    variants: Iterable[dict[str, str]]
    if entry.per == "ifname":
        variants = [{**base, "ifname": i} for i in facts.ifnames]
    elif entry.per == "device":
        variants = [{**base, "device": str(d)} for d in facts.devices]
    else:
        variants = [base]
    out = []
    for v in variants:
        suffix = f"-{v[entry.per]}" if entry.per is not None else ""
        out.append(Planned(entry.name + suffix, fill(entry.member, v), [fill(a, v) for a in entry.argv],
                           Path(fill(entry.produces, v)) if entry.produces else None, entry.source))
    return out


def plan(table: Table, facts: NodeFacts, with_: Sequence[str] = ()) -> list[Planned]:
    """Every command of the node's bundle, in table order; `with_` names default: false entries to add."""
    chosen: list[Entry] = []
    for section in sections(facts):
        for e in getattr(table, section):
            if e.vendor is not None and e.vendor != facts.vendor:
                continue
            if e.default or e.name in with_:
                chosen.append(e)
    known = {e.name for s in Table.model_fields for e in getattr(table, s)}
    unknown = [w for w in with_ if w not in known]
    if unknown:
        raise ValueError(f"--with {', '.join(unknown)}: no such collector; known: {sorted(known)}")
    return [p for e in chosen for p in expand(e, facts)]
