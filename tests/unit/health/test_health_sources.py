"""Parsers of the node-health sources and the command end to end against a real node agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.health.cli import run
from gpufleet.health.observe import (
    XidSeen,
    merge_xids,
    normalize_pci,
    parse_dcgmi_dmon,
    parse_kernel_log,
    parse_nvidia_smi,
)
from gpufleet.sandbox.agent.kmsg import xid_line


def test_kernel_log_lines_from_the_agent_and_dmesg() -> None:
    agent = xid_line(host="gpu-1", at=1700000000.25, uptime=5.0, pci="0000:5d:00", xid=79, pid=None,
                     proc=None, text="GPU has fallen off the bus.")
    dmesg = "2024-12-02T13:36:00,500000+00:00 NVRM: Xid (PCI:0000:18:00): 48, pid=77, name=python, DBE."
    plain = "[ 12.3] NVRM: Xid (PCI:0000:ab:00.0): 13, pid=1, name=x, Graphics Exception"
    noise = "kernel: eth0 link up"
    got = parse_kernel_log([agent, dmesg, plain, noise], {"0000:5d:00": 3, "0000:18:00": 0}, default_at=9.0)
    assert list(got.xids) == [XidSeen(3, 79, 1700000000.25, "0000:5d:00"),
                              XidSeen(0, 48, 1733146560.5, "0000:18:00"),
                   XidSeen(None, 13, 9.0, "0000:ab:00")]


def test_pci_normalisation_and_merge() -> None:
    assert normalize_pci("00000000:5D:00.0") == "0000:5d:00" == normalize_pci("0000:5d:00")
    a = [XidSeen(3, 45, 1.0)] * 3 + [XidSeen(3, 79, 0.5)]
    b = [XidSeen(3, 45, 1.0)] * 2 + [XidSeen(1, 13, 2.0)]
    assert merge_xids(a, b) == [XidSeen(3, 79, 0.5)] + [XidSeen(3, 45, 1.0)] * 3 + [XidSeen(1, 13, 2.0)]


def test_dcgmi_and_nvidia_smi_parsers() -> None:
    dmon = "#Entity   XIDER  DBEVL\nID\nGPU 0     0      0\nGPU 1     79     N/A\n"
    r = parse_dcgmi_dmon(dmon, [230, 311])
    assert [(g.index, g.fields) for g in r] == [(0, {230: 0.0, 311: 0.0}), (1, {230: 79.0})]
    smi = ("0, 00000000:18:00.0, 0, 3, 41, 5, 16, 570.124.06, 96.00.9F.00.04\n"
           "1, 00000000:2A:00.0, [N/A], 0, 39, 5, 16, 570.124.06, 96.00.9F.00.04\n")
    gpus, pci = parse_nvidia_smi(smi)
    assert pci == {"0000:18:00": 0, "0000:2a:00": 1}
    assert gpus[0].fields == {311: 0.0, 310: 3.0, 150: 41.0} and 311 not in gpus[1].fields


def test_node_health_against_a_live_agent(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("t0k\n")
    sock = tmp_path / "a.sock"
    err = open(tmp_path / "agent.err", "wb")  # noqa: SIM115
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.sandbox.agent", "--node", "gpu-5", "--listen", "127.0.0.1:0",
         "--control-socket", str(sock), "--token-file", str(tmp_path / "tok"), "--state-dir",
         str(tmp_path / "st"), "--kernel-log", str(tmp_path / "kern.log")],
        stdout=subprocess.DEVNULL, stderr=err)
    try:
        import httpx

        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            assert agent.poll() is None, (tmp_path / "agent.err").read_text()
            time.sleep(0.1)
        base = ["--sandbox", "--node", "gpu-5", "--agent-socket", str(sock), "--token-file",
                str(tmp_path / "tok"), "--lock-file", str(tmp_path / "lock")]

        def check(*extra: str) -> tuple[int, str]:
            from io import StringIO

            out = StringIO()
            return run([*base, *extra], out=out), out.getvalue()

        assert check() == (0, "healthy\n")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://a",
                          headers={"Authorization": "Bearer t0k"}) as c:
            c.post("/inject", json={"gpu": 2, "field_id": 230, "value": 79, "kmsg": True})
            c.post("/inject", json={"gpu": 2, "field_id": 230, "value": 45, "kmsg": True, "burst": 10})
        fake = tmp_path / "scontrol"
        fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'drain.args'}\n")
        fake.chmod(0o755)
        sinfo = tmp_path / "sinfo"

        def reason_is(reason: str) -> None:
            sinfo.write_text(f"#!/bin/sh\necho 'gpu-5|drained|{reason}|2026-12-05T05:00:00'\n")
            sinfo.chmod(0o755)

        reason_is("none")
        rc, text = check("--format", "json", "--slurm-drain", "--scontrol", str(fake), "--sinfo", str(sinfo))
        doc = json.loads(text)
        assert rc == 1 and doc["status"] == "problem"
        assert [f["fault_id"] for f in doc["findings"]] == ["gpu-xid-79"]  # the 45s are echoes
        assert (tmp_path / "drain.args").read_text() == (
            "update nodename=gpu-5 state=drain "
            "reason=gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 2)\n")
        # A rolling upgrade holds the node (its mark is the reason), or held it after giving up:
        # remediation stands aside and says so; the fault is still reported (exit 1).
        for mark in ("gpufleet-upgrade sandbox-1: driver -> 570.124.06",
                     "gpufleet-upgrade-failed: gate failed at 570.124.06"):
            (tmp_path / "drain.args").unlink(missing_ok=True)
            reason_is(mark)
            rc, text = check("--format", "json", "--slurm-drain", "--scontrol", str(fake), "--sinfo",
                             str(sinfo))
            doc = json.loads(text)
            assert rc == 1 and doc["drain"]["stoodAside"] == mark, doc
            assert not (tmp_path / "drain.args").exists()
        # Another actor's reason (a person's) is no rollout's: remediation drains as before.
        reason_is("alice: bad fan")
        check("--slurm-drain", "--scontrol", str(fake), "--sinfo", str(sinfo))
        assert (tmp_path / "drain.args").exists()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://a",
                          headers={"Authorization": "Bearer t0k"}) as c:
            c.post("/clear", json={"gpu": None})
        assert check() == (0, "healthy\n")  # the kernel log still has the lines: history only
        rc, text = check("--token-file", str(tmp_path / "tok-missing"))
        assert rc == 2 and text.startswith("cannot check:")
    finally:
        agent.terminate()
        agent.wait(10)
        err.close()
    rc, text = check()
    assert rc == 2 and "unreachable" in text  # agent gone: UNKNOWN, never healthy


def test_a_check_skips_or_waits_for_a_running_check_of_the_same_node(tmp_path: Path) -> None:
    import fcntl
    import threading
    from io import StringIO

    lock = tmp_path / "lock"
    held = open(lock, "a")  # noqa: SIM115 - another check of this node, holding the lock
    fcntl.flock(held, fcntl.LOCK_EX)
    base = ["--sandbox", "--node", "gpu-5", "--agent-socket", str(tmp_path / "none.sock"),
            "--token-file", str(tmp_path / "tok"), "--lock-file", str(lock)]
    (tmp_path / "tok").write_text("t0k\n")

    out = StringIO()
    assert run(base, out=out) == 2  # the periodic check never piles up behind another
    assert out.getvalue() == "cannot check: another node-health check of this node is running\n"

    threading.Timer(0.3, held.close).start()  # the other check ends
    out = StringIO()
    t0 = time.monotonic()
    assert run([*base, "--wait-lock", "5"], out=out) == 2
    # It waited for the lock and then checked for itself: the agent is absent, so UNKNOWN.
    assert 0.25 <= time.monotonic() - t0 < 5 and "unreachable" in out.getvalue()

    out = StringIO()
    assert run([*base, "--wait-lock", "-1"], out=out) == 2
    assert out.getvalue() == "UNKNOWN: --wait-lock must be >= 0\n"
