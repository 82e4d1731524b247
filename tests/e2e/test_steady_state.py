"""End to end on the real sandbox (issue 9): every experiment starts from a verified steady state,
and a node that comes back after a crash leaves the resumed training job alone.

1. Between two experiments the cluster is broken (the training job cancelled, an idle node
   drained); the runner heals it before the second experiment, records what it healed, and the
   second experiment is judged on its own run.
2. After `node-crash` (its rollback restarts the crashed node's daemons, so the node returns while
   the job runs elsewhere), the job's incarnation stays the same and training goes on: the old
   incarnation's clean-up on the returning node cannot touch the new job (a new JobId).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos import engine, steady
from gpufleet.core.sandbox_contract import read_controller_status, read_state
from gpufleet.gameday import GamedayOptions, Result, run_gameday
from gpufleet.gameday.evaluate import ExperimentResult
from gpufleet.gameday.runner import Listener, teardown_sandbox
from gpufleet.slo import EventKind

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root"),
    pytest.mark.timeout(900),
]


def _slurm(*args: str) -> str:
    st = read_state("sandbox")
    return subprocess.run(st.slurm_command(*args), capture_output=True, text=True, timeout=30,
                          check=True).stdout


class BreakAfterFirst(Listener):
    """After the first experiment: cancel the training job and drain a node the job does not use."""

    def __init__(self) -> None:
        self.broken: list[str] = []
        self.idle = ""

    def experiment_done(self, index: int, result: ExperimentResult) -> None:
        if index != 0:
            return
        st = read_state("sandbox")
        job = _slurm("squeue", "-h", "-n", str(st.training_job_name), "-t", "R", "-o", "%i").split()
        busy = set(_context().backend().job_nodes())
        idle = next(n.name for n in st.nodes if n.role == "compute" and n.name not in busy)
        _slurm("scancel", *job)
        _slurm("scontrol", "update", f"nodename={idle}", "state=drain", "reason=e2e-broken")
        self.broken = [f"job {','.join(job)} cancelled", f"{idle} drained"]
        self.idle = idle


def _context() -> engine.Context:
    return engine.context({"gpufleet_backend": "sandbox", "gpufleet_stack": "sandbox",
                           "gpufleet_stacks_dir": str(REPO / "stacks")})


def _options(tmp_path: Path, *names: str, keep: bool = False) -> GamedayOptions:
    return GamedayOptions(stack="sandbox", backend="sandbox", experiments=names,
                          report_dir=tmp_path / "report", experiments_dir=REPO / "experiments",
                          stacks_dir=REPO / "stacks", keep_sandbox=keep)


def test_second_experiment_is_judged_on_its_own_after_healing(tmp_path: Path) -> None:
    listener = BreakAfterFirst()
    run = run_gameday(_options(tmp_path, "gpu-xid79-fallen-off-bus", "gpu-xid48-double-bit-ecc"), listener)
    first, second = run.results
    assert listener.broken, "the cluster was not broken between the experiments"
    assert first.result is Result.MET, first.notes
    healing: dict[str, Any] = second.healing or {}
    problems = " ".join(healing.get("problems", []))
    assert f"node {listener.idle} is not schedulable" in problems, healing
    assert "training" in problems, healing  # the job runs on no node / makes no progress
    assert healing["ok"] is True and healing["seconds"] > 0, healing
    assert any("resumed" in a and listener.idle in a for a in healing["actions"]), healing
    # Judged on its own run: its fault was injected after the cluster was healed.
    assert second.result is Result.MET, (second.notes, second.measurement)
    assert second.timeline is not None
    injected = second.timeline.first(EventKind.INJECTED)
    assert injected is not None and injected.at > second.started_at


def test_returning_node_leaves_the_resumed_job_alone(tmp_path: Path) -> None:
    try:
        run = run_gameday(_options(tmp_path, "node-crash", keep=True))
        (r,) = run.results
        assert r.result is Result.MET, (r.notes, r.measurement)
        st = read_state("sandbox")
        assert st.training_controller is not None
        before = read_controller_status(Path(st.training_controller))
        assert before.incarnation >= 1 and before.restarts, "the crash did not restart the job"
        ctx = _context()
        # The crashed node is back; watch the job for 20 s: same incarnation, steady state holds.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(4)
            now = read_controller_status(Path(st.training_controller))
            assert now.incarnation == before.incarnation, now.restarts
            assert steady.check(ctx.backend(), ctx.ledger) == []
    finally:
        teardown_sandbox(_options(tmp_path), Listener())
