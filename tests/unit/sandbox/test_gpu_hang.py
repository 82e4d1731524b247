"""A GPU hang without an XID: the agent's state and documents, what a process on the GPU obeys, and
a serving replica's engine stalling on it (readiness fails, the process stays up)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from gpufleet.sandbox.agent import fields as F
from gpufleet.sandbox.agent.exposition import Snapshot, gpu_values
from gpufleet.sandbox.agent.state import (
    clear,
    from_json,
    hang,
    health_doc,
    initial_state,
    parse_hang,
    to_json,
    write_json_atomic,
)
from gpufleet.sandbox.gpu_health import GpuHealth, gpu_fault, gpu_hung


@pytest.mark.parametrize(("body", "msg"), [
    ([], "body must be"), ({"gpu": 0, "x": 1}, "body must be"), ({"gpu": 8}, "0..7"),
    ({"gpu": True}, "0..7"), ({}, "0..7"),
])
def test_parse_hang_rejects_bad_bodies(body: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_hang(body, 8)


def test_hang_is_in_the_health_document_with_no_error_and_survives_a_restart() -> None:
    s = hang(initial_state("n0", 2, 1.0), 1, 5.0)
    s = hang(s, 1, 9.0)  # hung already: since when it first hung
    doc = health_doc(s)
    assert doc["gpus"] == {"1": {"hung_since": 5.0}}
    assert gpu_hung(doc, 1) and not gpu_hung(doc, 0) and gpu_hung(doc, (0, 1))
    assert gpu_fault(doc, (0, 1), started_at=0.0) is None  # no error says so: nothing fails, it stops
    back = from_json(json.loads(json.dumps(to_json(s))), "n0", 2, 20.0)
    assert back.gpus[1].hung_since == 5.0 and back.gpus[0].hung_since is None


def test_a_gpu_reset_ends_the_hang() -> None:
    s = hang(hang(initial_state("n0", 2, 1.0), 0, 2.0), 1, 2.0)
    one = clear(s, 0, 3.0)
    assert one.gpus[0].hung_since is None and one.gpus[1].hung_since == 2.0
    assert all(g.hung_since is None for g in clear(s, None, 3.0).gpus)


def test_a_hung_gpu_reads_full_utilization_and_nothing_else_changes() -> None:
    s = initial_state("n0", 2, 1.0)
    before = gpu_values(Snapshot(s, "NVIDIA H200", frozenset(), []), 0)
    after = gpu_values(Snapshot(hang(s, 0, 2.0), "NVIDIA H200", frozenset(), []), 0)
    assert after[F.GPU_UTIL] == 100.0
    assert {k: v for k, v in after.items() if k != F.GPU_UTIL} == {
        k: v for k, v in before.items() if k != F.GPU_UTIL}
    assert after[F.XID_ERRORS] == 0


def test_a_process_blocks_while_its_gpu_is_hung_and_goes_on_after_the_reset(tmp_path: Path) -> None:
    path = tmp_path / "gpu-health.json"
    hung = hang(initial_state("n0", 2, 1.0), 1, 2.0)
    write_json_atomic(path, health_doc(hung))
    other, mine = GpuHealth(path, (0,)), GpuHealth(path, (1,))
    assert not other.hung() and mine.hung()
    done = threading.Event()

    def step() -> None:
        mine.wait_while_hung(poll_s=0.01)
        done.set()

    threading.Thread(target=step, daemon=True).start()
    assert not done.wait(0.3)  # the pass does not complete while the GPU is hung
    time.sleep(0.01)  # a new mtime for the reader's change check
    write_json_atomic(path, health_doc(clear(hung, 1, 3.0)))
    assert done.wait(5.0)
    assert not mine.hung() and mine.error() is None
