"""The node-health check's before-drain hook (a diagnostic bundle): once per fault while it persists,
with the fault in its environment, bounded by its timeout, and never in the way of the drain."""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

from gpufleet.core.taxonomy import LadderAction
from gpufleet.health import cli
from gpufleet.health.decide import Finding

XID79 = Finding("gpu-xid-79", "GPU fallen off the bus", LadderAction.REPLACE, gpu=3, xid=79, at=1234.5)


def _args(tmp_path: Path, command: str, timeout: float = 5.0) -> argparse.Namespace:
    return argparse.Namespace(node="gpu-1", before_drain=command, before_drain_timeout=timeout,
                              hook_marker=tmp_path / "lock.before-drain")


def test_the_hook_runs_once_per_fault_with_the_fault_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "calls"
    args = _args(tmp_path, f'echo "$GPUFLEET_NODE|$GPUFLEET_FAULT_ID|$GPUFLEET_DETECTED_AT|'
                           f'$GPUFLEET_DRAIN_REASON" >> {out}')
    first = cli._before_drain(args, XID79, now=2000.0)
    assert first is not None and first["rc"] == 0
    assert cli._before_drain(args, XID79, now=2005.0) is None  # the same fault, a later check
    assert out.read_text().splitlines() == [
        f"gpu-1|gpu-xid-79|1234.500|{cli.drain_reason(XID79)}"]
    assert cli._before_drain(args, None, now=2010.0) is None  # healthy again: the marker goes
    assert not args.hook_marker.exists()
    assert cli._before_drain(args, XID79, now=2020.0) is not None  # the fault again: a new bundle
    assert len(out.read_text().splitlines()) == 2


def test_a_hook_past_its_timeout_is_killed_and_reported(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = cli._before_drain(_args(tmp_path, "sleep 30", timeout=0.5), XID79, now=1.0)
    assert time.monotonic() - t0 < 5
    assert res is not None and res["rc"] is None and res["error"] == "killed after 0.5 s"


def test_a_bad_timeout_is_refused_and_a_check_that_drains_nothing_runs_no_hook(tmp_path: Path) -> None:
    """A whole check: the timeout is validated at the edge; with no agent answering the verdict is
    UNKNOWN, nothing is drained, and no bundle is collected."""
    buf = io.StringIO()
    rc = cli.run(["--node", "gpu-1", "--before-drain-timeout", "0", "--lock-file", str(tmp_path / "l")], buf)
    assert rc == 2 and "--before-drain-timeout must be > 0" in buf.getvalue()
    buf = io.StringIO()
    rc = cli.run(["--node", "gpu-1", "--sandbox", "--agent-socket", str(tmp_path / "none.sock"),
                  "--token-file", str(tmp_path / "t"), "--format", "json", "--lock-file", str(tmp_path / "l"),
                  "--before-drain", f"touch {tmp_path / 'ran'}"], buf)
    doc = json.loads(buf.getvalue())
    assert rc == 2 and doc["drain"] is None and not (tmp_path / "ran").exists()
