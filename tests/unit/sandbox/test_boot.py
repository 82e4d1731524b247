"""A sandbox node's boot in a time namespace (gpufleet.sandbox.boot) and its RebootProgram's pure
parts (gpufleet.sandbox.node_reboot, gpufleet.sandbox.configs)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.config.load import load_named_stack
from gpufleet.core import procs
from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.sandbox import boot, configs
from gpufleet.sandbox.layout import plan_layout
from gpufleet.sandbox.node_reboot import boot_order

REPO = Path(__file__).resolve().parents[3]


def test_booted_wraps_the_program_and_a_new_boot_replaces_the_old_wrapper() -> None:
    first = boot.booted(["slurmd", "-D", "-N", "gpu-0"], -1000)
    assert first == ["unshare", "--time", "--boottime", "-1000", "--", "slurmd", "-D", "-N", "gpu-0"]
    again = boot.booted(first, -1200)
    assert again == ["unshare", "--time", "--boottime", "-1200", "--", "slurmd", "-D", "-N", "gpu-0"]
    assert boot.unwrapped(again) == ["slurmd", "-D", "-N", "gpu-0"]
    assert boot.boot_offset_of(again) == -1200
    assert boot.boot_offset_of(["slurmd"]) is None
    assert boot.unwrapped(["unshare", "--time"]) == ["unshare", "--time"]  # not our wrapper: kept


def test_an_offset_in_the_future_is_refused() -> None:
    with pytest.raises(ValueError, match="never positive"):
        boot.booted(["x"], 5)


@pytest.mark.parametrize(
    ("ns_uptime", "ns_offset", "expected"),
    [
        (70137.21, 0, -70137),  # from the host: the uptime starts at 0.21 s
        (100.5, -70000, -70100),  # from a node's namespace: offsets are absolute, the host is 70100.5
        (3.9, -70000, -70003),
    ],
)
def test_fresh_offset_gives_an_uptime_under_one_second(ns_uptime: float, ns_offset: int,
                                                        expected: int) -> None:
    offset = boot.fresh_offset(ns_uptime, ns_offset)
    assert offset == expected
    host_uptime = ns_uptime - ns_offset
    assert 0 <= host_uptime + offset < 1


def test_boot_time_is_now_minus_the_namespace_uptime() -> None:
    assert boot.boot_time(now_s=1_000_000.0, host_uptime_s=70_000.0, offset_s=-69_990) == 999_990.0


def test_parse_timens_offsets() -> None:
    text = "monotonic           0         0\nboottime        -1000         0\n"
    assert procs.parse_timens_offsets(text) == -1000
    assert procs.parse_timens_offsets("") == 0


def test_the_daemons_of_a_node_share_one_boot() -> None:
    a = boot.node_boot_offset("gf-test-node-a")
    time.sleep(0.01)
    assert boot.node_boot_offset("gf-test-node-a") == a


def test_the_agent_boots_before_slurmd() -> None:
    def proc(name: str) -> SandboxProcess:
        return SandboxProcess(name=name, pid=1, start_time=1, launch=Launch(program=["x"], log="/dev/null"),
                              node="gpu-0")
    assert [p.name for p in boot_order([proc("slurmd@gpu-0"), proc("other"), proc("agent@gpu-0")])] == [
        "agent@gpu-0", "slurmd@gpu-0", "other"]


def test_slurm_conf_names_the_reboot_program_and_the_script_starts_it_detached() -> None:
    spec = load_named_stack("sandbox", REPO / "stacks")
    layout = plan_layout("sandbox", spec, "abc123", Path("/run/gf/sandbox/run-abc123"))
    conf = configs.slurm_conf(layout, Path("/venv/bin/gpufleet"))
    assert "RebootProgram=/run/gf/sandbox/run-abc123/slurm/reboot.sh\n" in conf
    assert "\nResumeTimeout=180\n" in conf
    script = configs.reboot_script(layout, Path("/venv/bin/gpufleet"))
    assert ("setsid -f /venv/bin/python -m gpufleet.sandbox.node_reboot --stack sandbox "
            "--state-root /run/gf ") in script
    assert script.rstrip().endswith("exit 0")


needs_timens = pytest.mark.skipif(not Path("/proc/self/timens_offsets").exists() or os.geteuid() != 0,
                                  reason="time namespaces need Linux >= 5.6 and root")


@needs_timens
def test_a_booted_process_sees_a_fresh_uptime_and_the_host_its_start_time() -> None:
    """The kernel facts the module relies on, on this machine: the wrapper exec()s (same PID), the
    uptime inside starts under a second, and a reader inside converts start times back."""
    argv = boot.booted(["sh", "-c", "cat /proc/uptime; sleep 2"], boot.new_boot_offset())
    read_stat = "print(open('/proc/{}/stat').read().rsplit(')', 1)[1].split()[19])"
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as p:
        try:
            time.sleep(0.3)
            host_view = procs.start_time(p.pid)
            inside = subprocess.run(boot.booted(["python3", "-c", read_stat.format(p.pid)], -100),
                                    capture_output=True, text=True, check=True)
            # procs.start_time converts back wherever it runs: a health check or bundle hook that
            # slurmd starts in the node's time namespace recognises the host's recorded processes.
            via_procs = subprocess.run(
                boot.booted([sys.executable, "-c", f"from gpufleet.core.procs import start_time; "
                             f"print(start_time({p.pid}))"], -100),
                capture_output=True, text=True, check=True)
            uptime = float(p.stdout.readline().split()[0]) if p.stdout else -1.0
        finally:
            p.kill()
    assert 0 <= uptime < 2.5
    assert host_view is not None
    # A reader 100 s "younger" than the host reads every start time 100 s earlier.
    assert int(inside.stdout) + 100 * os.sysconf("SC_CLK_TCK") == host_view
    assert int(via_procs.stdout) == host_view


@pytest.mark.parametrize("host_ns", [95_000_000_000, 95_004_999_999, 95_009_999_999, 100_500_000_000])
def test_a_start_time_read_inside_a_time_namespace_converts_back(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host_ns: int) -> None:
    # The kernel's arithmetic (fs/proc/array.c): the reader's offset added to the start time in
    # nanoseconds as an unsigned 64-bit sum, then divided to ticks. A reader 100 s "younger" than the
    # host reads a process that started 95 s after the host's boot (before its own) wrapped around.
    tck = os.sysconf("SC_CLK_TCK")
    offset_s = -100
    printed = ((host_ns + offset_s * 1_000_000_000) % 2**64) // (1_000_000_000 // tck)
    host_ticks = host_ns // (1_000_000_000 // tck)
    monkeypatch.setattr(procs, "own_boot_offset", lambda: offset_s)
    stat = tmp_path / "stat"
    stat.write_text(f"42 (a (b) c) S {' '.join(['0'] * 18)} {printed} 0\n")
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real_read(
        stat if str(self) == "/proc/42/stat" else self, *a, **k))
    seen = procs.start_time(42)
    assert seen is not None
    if host_ns >= -offset_s * 1_000_000_000:
        assert seen == host_ticks  # younger than the reader's boot: exact
    else:
        assert abs(seen - host_ticks) <= 1  # wrapped: known to one tick
    assert procs.alive(42, host_ticks)
    assert not procs.alive(42, host_ticks + 2)


def test_slurm_boot_time_floors_the_clock_and_rounds_the_uptime_up() -> None:
    # registration at 36.977 s with an uptime of 1.7 s: the true boot is 35.277, Slurm sees 34
    assert boot.slurm_boot_time(now_s=36.977, ns_uptime_s=1.7) == 34
    assert boot.slurm_boot_time(now_s=36.0, ns_uptime_s=1.0) == 35


@settings(max_examples=2000, deadline=None)
@given(request=st.floats(1e6, 2e6), to_start=st.floats(0, 5), host_frac=st.floats(0, 0.999),
       to_offset=st.floats(0, 3), to_register=st.floats(0, 120))
def test_a_reboot_that_waits_for_its_time_always_completes_in_slurm(
        request: float, to_start: float, host_frac: float, to_offset: float, to_register: float) -> None:
    """The CI stall, modelled: slurmctld's request at `request`, the RebootProgram started after it,
    the offset taken no earlier than reboot_offset_not_before() (plus any delay), slurmd registering
    any time later. The boot Slurm computes is never older than the request's whole second."""
    started = request + to_start
    taken = boot.reboot_offset_not_before(started) + to_offset
    # the new namespace's uptime at `taken` is the fraction of the host's uptime (fresh_offset)
    host_uptime_at_taken = 50_000 + host_frac
    offset = boot.fresh_offset(host_uptime_at_taken, 0)
    registered = taken + to_register
    ns_uptime = host_uptime_at_taken + (registered - taken) + offset
    assert boot.slurm_boot_time(registered, ns_uptime) >= math.floor(request)


def test_waiting_one_second_from_the_start_was_not_enough() -> None:
    """The CI run's numbers: request 35.048, program started 35.3, offset at 36.3 with the host's
    uptime 0.9 into its second, slurmd registered at 36.977: Slurm computed a boot before the
    request. reboot_offset_not_before moves the offset to 37 or later."""
    request, taken, frac, registered = 35.048, 36.3, 0.9, 36.977
    ns_uptime_at = frac + (registered - taken)
    assert boot.slurm_boot_time(registered, ns_uptime_at) < math.floor(request)
    assert boot.reboot_offset_not_before(35.3) == 37
