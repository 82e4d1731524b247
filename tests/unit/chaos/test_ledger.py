import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.chaos.ledger import FaultRecord, Ledger, Rollback, revert_pending


def _rec(i: int = 0, **kw: Any) -> FaultRecord:
    return FaultRecord(
        kind="link-down",
        backend="sandbox",
        target={"node": f"gpu-{i}"},
        rollback=Rollback("test.touch", {"n": i}),
        **kw,
    )


def test_record_is_on_disk_before_apply_and_pending_until_reverted(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l" / "faults.jsonl")
    r = led.record(_rec(1))
    lines = [json.loads(x) for x in (tmp_path / "l" / "faults.jsonl").read_text().splitlines()]
    assert lines == [{**r.to_json()}]
    assert [p.id for p in led.pending()] == [r.id]
    done: list[int] = []
    res = revert_pending(led, {"test.touch": lambda a: done.append(a["n"])})
    assert [x.ok for x in res] == [True] and done == [1]
    assert led.pending() == [] and led.reverted_at(r.id) is not None


def test_revert_is_newest_first_and_idempotent(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "faults.jsonl")
    ids = [led.record(_rec(i)).id for i in range(3)]
    done: list[int] = []
    revert_pending(led, {"test.touch": lambda a: done.append(a["n"])})
    assert done == [2, 1, 0]
    assert revert_pending(led, {"test.touch": lambda a: done.append(a["n"])}) == []
    assert done == [2, 1, 0] and len(ids) == 3


def test_failed_rollback_stays_pending_and_others_still_run(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "faults.jsonl")
    bad = led.record(FaultRecord(kind="x", backend="sandbox", target={}, rollback=Rollback("test.fail")))
    good = led.record(_rec(5))
    done: list[int] = []

    def fail(_: dict[str, Any]) -> None:
        raise RuntimeError("link is gone")

    res = revert_pending(led, {"test.touch": lambda a: done.append(a["n"]), "test.fail": fail})
    assert {r.record.id: r.ok for r in res} == {good.id: True, bad.id: False}
    assert "link is gone" in str([r.error for r in res if not r.ok])
    assert [p.id for p in led.pending()] == [bad.id]
    assert done == [5]


def test_dry_run_records_are_never_pending(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "faults.jsonl")
    led.record(_rec(1, dry_run=True))
    assert led.pending() == [] and len(led.records()) == 1


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "faults.jsonl")
    r = led.record(_rec(1))
    with open(led.where, "a") as fh:
        fh.write('{"op": "apply", "id": "tor')  # power loss mid-append
    assert [p.id for p in led.pending()] == [r.id]


def test_revert_after_the_writer_was_killed_with_sigkill(tmp_path: Path) -> None:
    """A separate process records a fault and is SIGKILLed while 'applying' it; a fresh process
    (this one) finds the fault in the ledger and reverts it."""
    path = tmp_path / "faults.jsonl"
    marker = tmp_path / "applied"
    code = f"""
import os, signal, time
from gpufleet.chaos.ledger import FaultRecord, Ledger, Rollback
led = Ledger({str(path)!r})
led.record(FaultRecord(kind="link-down", backend="sandbox", target={{"node": "gpu-3"}},
                       rollback=Rollback("test.touch", {{"n": 3}})))
open({str(marker)!r}, "w").write("applied")
os.kill(os.getpid(), signal.SIGKILL)
"""
    p = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert marker.exists()
    led = Ledger(path)
    assert [r.target for r in led.pending()] == [{"node": "gpu-3"}]
    done: list[int] = []
    revert_pending(led, {"test.touch": lambda a: (done.append(a["n"]), marker.unlink())[0]})
    assert done == [3] and not marker.exists() and led.pending() == []


def test_unknown_rollback_is_reported_not_skipped(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "faults.jsonl")
    led.record(_rec(1))
    res = revert_pending(led, {})
    assert not res[0].ok and "unknown rollback" in str(res[0].error)
    assert len(led.pending()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a read-only directory matter")
def test_unwritable_ledger_fails_before_the_fault(tmp_path: Path) -> None:
    led = Ledger(Path("/proc/gpufleet-ledger/faults.jsonl"))
    with pytest.raises(OSError):
        led.record(_rec(1))
