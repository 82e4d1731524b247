"""A killed run's network objects that no state file names any more: found and removed.

`down` removes a run from its state file. A run killed together with the process that knew where
its state file was (a test's temporary state root, removed or forgotten) leaves its namespaces,
bridges and veths behind, with no state to plan their removal from. Every one of them carries the
run id (layout.py: namespaces `gf-<run>-<node>`, links `gf<run><m|h|f>...`), so they can be grouped
by run without it.

- A run that some state file under the state root records is not a leftover: `down` owns it.
- A run with a process in any of its namespaces is live: a sandbox of another state root (a test
  running now). It is listed and never touched.
- Any other run is a leftover: nothing runs in it and nothing records it. `down --leftovers`
  removes its links and namespaces, after checking again that no process entered them.

What a leftover's fault ledger held cannot be found this way: `gpufleet chaos revert --ledger`
with the run's ledger is still the way back for an injected fault (docs/sandbox.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.sandbox_contract import state_root
from gpufleet.sandbox import network
from gpufleet.sandbox.state import existing

_NETNS = re.compile(r"^gf-([0-9a-f]{6})-[A-Za-z0-9_.-]+$")
_LINK = re.compile(r"^gf([0-9a-f]{6})[mhf][0-9.]*$")


@dataclass
class RunObjects:
    run_id: str
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def group_by_run(namespaces: Iterable[str], links: Iterable[str]) -> dict[str, RunObjects]:
    """The sandbox's namespaces and links, by the run id in their names (pure); others are ignored."""
    runs: dict[str, RunObjects] = {}
    for ns in sorted(namespaces):
        m = _NETNS.match(ns)
        if m:
            runs.setdefault(m.group(1), RunObjects(m.group(1))).namespaces.append(ns)
    for link in sorted(links):
        m = _LINK.match(link)
        if m:
            runs.setdefault(m.group(1), RunObjects(m.group(1))).links.append(link)
    return runs


def recorded_runs(root: Path | None = None) -> set[str]:
    """Run ids that a Slurm sandbox state file under the state root records (readable or not: an
    unreadable state file's run is not ours to remove, so its folder's run ids count too)."""
    r = root or state_root()
    out: set[str] = set()
    if not r.is_dir():
        return out
    for path in r.glob("*/state.json"):
        found = existing(path.parent.name, r)
        if found.state is not None:
            out.add(found.state.run_id)
        out |= {p.name.removeprefix("run-") for p in path.parent.glob("run-*")}
    return out


@dataclass(frozen=True)
class Survey:
    leftovers: list[RunObjects]  # nothing records them, nothing runs in them
    live: list[tuple[RunObjects, int]]  # unrecorded, with this many processes: another root's run


def survey(root: Path | None = None) -> Survey:
    runs = group_by_run(network.existing_netns(), network.existing_links())
    known = recorded_runs(root)
    leftovers, live = [], []
    for run_id, objs in sorted(runs.items()):
        if run_id in known:
            continue
        pids = {p for ns in objs.namespaces for p in network.netns_pids(ns)}
        if pids:
            live.append((objs, len(pids)))
        else:
            leftovers.append(objs)
    return Survey(leftovers, live)


def remove(objs: RunObjects) -> list[str]:
    """Remove a leftover's links and namespaces, unless a process entered them since the survey;
    what could not be removed, said."""
    pids = {p for ns in objs.namespaces for p in network.netns_pids(ns)}
    if pids:
        return [f"run {objs.run_id}: {len(pids)} process(es) run in its namespaces now; not touched"]
    return network.remove(objs.namespaces, (), objs.links)
