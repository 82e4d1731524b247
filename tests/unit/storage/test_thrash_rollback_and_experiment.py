"""The thrasher's rollback (every OSD started from its recipe and marked in, from the ledger's
arguments alone) on real processes, with the `ceph` command recorded instead of run; and the
storage-osd-thrash experiment: valid for Chaos Toolkit, every activity resolving."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from chaoslib.experiment import ensure_experiment_is_valid
from osd_state_support import three_osd_state

from gpufleet.chaos.backends import storage_undo
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.core.procs import alive
from gpufleet.core.storage_contract import (
    StorageSandboxState,
    read_storage_state,
    write_storage_state,
)

EXPERIMENT = Path(__file__).parents[3] / "experiments" / "storage" / "storage-osd-thrash.json"


def _state(root: Path) -> StorageSandboxState:
    return three_osd_state(root, "st", "ckpt", lambda i: ["sleep", f"{300 + i}"], 2**22 - 11)  # not running


def test_thrash_revert_starts_every_dead_osd_and_marks_all_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    write_storage_state(state, tmp_path)
    calls: list[tuple[str, ...]] = []
    def ceph_run(st: StorageSandboxState, *a: str, **k: Any) -> str:
        calls.append(a)
        return ""

    monkeypatch.setattr(storage_undo, "ceph_run", ceph_run)
    args: dict[str, Any] = {
        "stack": "st",
        "state_root": str(tmp_path),
        "osds": {p.name: p.launch.model_dump() for p in state.processes},
    }
    started: list[int] = []
    try:
        ROLLBACKS["storage.thrash-revert"](json.loads(json.dumps(args)))  # as the ledger stores them
        after = read_storage_state("st", tmp_path)
        started = [p.pid for p in after.processes]
        assert all(alive(p.pid, p.start_time) for p in after.processes)
        assert calls == [("osd", "in", "0", "1", "2")]
        # Idempotent: running OSDs are left alone, `in` again changes nothing.
        ROLLBACKS["storage.thrash-revert"](args)
        assert [p.pid for p in read_storage_state("st", tmp_path).processes] == started
        assert calls[-1] == ("osd", "in", "0", "1", "2")
    finally:
        for pid in started:
            os.kill(pid, signal.SIGKILL)


def test_the_thrash_experiment_is_valid_and_its_activities_resolve() -> None:
    exp = json.loads(EXPERIMENT.read_text())
    ensure_experiment_is_valid(exp)
    assert exp["configuration"]["gpufleet_backend"] == "storage"
    acts = exp["method"] + exp["rollbacks"] + exp["steady-state-hypothesis"]["probes"]
    for act in acts:
        prov = act["provider"]
        mod = importlib.import_module(prov["module"])
        assert prov["func"] in mod.__all__
        inspect.signature(getattr(mod, prov["func"])).bind(
            **prov.get("arguments", {}), configuration=exp["configuration"], secrets=None
        )
    judged = {p["provider"]["func"]: p["tolerance"] for p in exp["steady-state-hypothesis"]["probes"]}
    assert judged["thrash_within_limits"] == {"type": "regex", "target": "outcome", "pattern": "^PASS$"}
