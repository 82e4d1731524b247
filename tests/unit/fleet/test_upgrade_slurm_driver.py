"""The Slurm upgrade driver (gpufleet.fleet.upgrade.slurm_driver): every argv it builds, every
decision it makes, and a reboot driven against a scripted slurmctld that replays the states the
sandbox's real slurmctld showed (ADR 0064)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.core.sandbox_contract import Launch, SandboxProcess, SandboxState, read_state, write_state
from gpufleet.fleet.upgrade.model import Component
from gpufleet.fleet.upgrade.sandbox_driver import SandboxDriver
from gpufleet.fleet.upgrade.slurm_driver import (
    NEXT_STATE,
    NextState,
    NodeView,
    Progress,
    SlurmDriver,
    cancel_argv,
    choose_driver,
    owns,
    parse_show_node,
    reboot_argv,
    reboot_progress,
    requeue_argv,
    requeue_flags,
    show_jobs_argv,
    split_evictions,
)

P = ["ip", "netns", "exec", "h", "env", "SLURM_CONF=/s.conf"]
MARK = "gpufleet-upgrade sandbox-1: driver -> 570.124.06"


def test_reboot_argv_asks_for_asap_nextstate_down_with_the_mark() -> None:
    assert NEXT_STATE is NextState.DOWN
    assert reboot_argv(P, "gpu-1", MARK) == [*P, "scontrol", "reboot", "ASAP", "nextstate=DOWN",
                                             f"reason={MARK}", "gpu-1"]
    assert reboot_argv([], "gpu-1", "r", NextState.RESUME, asap=False) == [
        "scontrol", "reboot", "nextstate=RESUME", "reason=r", "gpu-1"]


def test_job_argvs() -> None:
    assert requeue_argv(P, ["7", "9"]) == [*P, "scontrol", "requeue", "7,9"]
    assert cancel_argv(P, ["8"]) == [*P, "scancel", "8"]
    assert show_jobs_argv(P) == [*P, "scontrol", "-o", "show", "job"]


SHOW_JOBS = (
    "JobId=7 JobName=llm train UserId=root(0) Priority=1 Requeue=1 Restarts=0 BatchFlag=1\n"
    "JobId=8 JobName=train-2b UserId=root(0) Requeue=0 Restarts=0\n"
)


def test_requeue_flags_and_the_split() -> None:
    flags = requeue_flags(SHOW_JOBS)
    assert flags == {"7": True, "8": False}
    assert split_evictions(["7", "8", "99"], flags) == (["7"], ["8", "99"])  # 99: gone, cancel is harmless


# `scontrol -o show node gpu-4` lines as the sandbox's slurmctld printed them (cut).
ISSUED = ("NodeName=gpu-4 Arch=x86_64 CoresPerSocket=1 State=DOWN+DRAIN+REBOOT_ISSUED ThreadsPerCore=1 "
          "BootTime=2026-12-05T05:12:15 SlurmdStartTime=2026-12-05T05:12:22 Reason=x : reboot issued")
DONE = ("NodeName=gpu-4 State=DOWN BootTime=2026-12-05T05:12:52 SlurmdStartTime=2026-12-05T05:12:57 "
        "Reason=gpufleet-upgrade a: driver -> 2 : reboot issued : reboot complete [root@2026-12-05T05:12:50]")


def test_parse_show_node() -> None:
    v = parse_show_node(ISSUED, tz_offset=0)
    assert v.flags == {"DOWN", "DRAIN", "REBOOT_ISSUED"} and v.state == "DOWN+DRAIN+REBOOT_ISSUED"
    assert v.boot_time == 1796447535.0  # 2026-12-05T05:12:15Z
    assert parse_show_node("", tz_offset=0) == NodeView(frozenset(), None, "")


REQ = 1796447570.4  # 05:12:50.4


@pytest.mark.parametrize(
    ("state", "boot", "reason", "expected"),
    [
        ("IDLE+DRAIN", 1796447535.0, MARK, Progress.PENDING),  # not yet picked up, old boot
        ("IDLE+DRAIN+REBOOT_REQUESTED", 1796447535.0, MARK, Progress.PENDING),
        ("DOWN+DRAIN+REBOOT_ISSUED", 1796447535.0, MARK + " : reboot issued", Progress.PENDING),
        ("DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING", 1796447535.0, MARK, Progress.PENDING),
        ("DOWN", 1796447572.0, MARK + " : reboot issued : reboot complete", Progress.DONE),
        ("DOWN", 1796447570.0, MARK + " : reboot complete", Progress.DONE),  # same whole second
        ("DOWN", 1796447535.0, MARK, Progress.PENDING),  # flags gone but the boot is old
        ("DOWN+NOT_RESPONDING", 1796447572.0, MARK, Progress.PENDING),
        ("DOWN", None, MARK, Progress.PENDING),
        ("DOWN+DRAIN", 1796447535.0, MARK + " : reboot issued : reboot timed out", Progress.TIMED_OUT),
    ],
)
def test_reboot_progress(state: str, boot: float | None, reason: str, expected: Progress) -> None:
    view = NodeView(frozenset(state.split("+")), boot, state)
    assert reboot_progress(view, reason, REQ) is expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (MARK, True),
        (MARK + " : reboot issued", True),
        (MARK + " : reboot issued : reboot complete", True),
        ("gpufleet-upgrade-failed: gate failed", False),
        ("alice: bad DIMM", False),
        (MARK + " : alice was here", False),
        (MARK + "x", False),
        ("Reboot ASAP", False),
        (None, False),
        ("", False),
    ],
)
def test_owns_only_its_own_mark_with_slurms_suffixes(reason: str | None, expected: bool) -> None:
    assert owns(reason, MARK) is expected
    assert owns(MARK, "") is False


def test_choose_driver() -> None:
    assert choose_driver("slurm", None) == "slurm"
    assert choose_driver("slurm", "sandbox") == "sandbox"
    assert choose_driver("kueue", None) == choose_driver("volcano", None) == "gpu-operator"
    with pytest.raises(ValueError, match="unknown driver"):
        choose_driver("slurm", "k8s")


# ------------------------------------------------------------------ the driver against scripted Slurm


class ScriptedSlurm:
    """Answers the driver's commands: `scontrol -o show node` walks through the states the real
    slurmctld showed once the reboot is asked for; sinfo gives the reason that goes with each."""

    def __init__(self, steps: list[tuple[str, str, str]]) -> None:
        self.steps = steps  # (State, BootTime, reason)
        self.i = -1  # before the reboot request
        self.calls: list[list[str]] = []
        self.after_resume: list[str] = ["idle"]  # sinfo's states once resumed, one per call, the last kept
        self.resumed = False

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        args = list(argv)
        self.calls.append(args)
        cmd = args[len(P):]
        out = ""
        state, boot, reason = self.steps[max(self.i, 0)]
        if cmd[:2] == ["scontrol", "reboot"]:
            self.i = 0
        elif cmd[:4] == ["scontrol", "-o", "show", "node"]:
            out = f"NodeName=gpu-4 State={state} BootTime={boot} SlurmdStartTime={boot}\n"
            if self.i >= 0:
                self.i = min(self.i + 1, len(self.steps) - 1)
        elif cmd[:2] == ["scontrol", "update"] and "state=RESUME" in cmd:
            self.resumed = True
        elif cmd[:1] == ["sinfo"] and self.resumed:
            now = self.after_resume.pop(0) if len(self.after_resume) > 1 else self.after_resume[0]
            out = f"gpu-4|{now}||Unknown\n"
        elif cmd[:1] == ["sinfo"]:
            out = f"gpu-4|{state.lower()}|{reason}|Unknown\n"
        elif cmd[:4] == ["scontrol", "-o", "show", "job"]:
            out = SHOW_JOBS
        return subprocess.CompletedProcess(args, 0, out, "")


@pytest.fixture
def up(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("t\n")
    agent = SandboxProcess(name="agent@gpu-4", pid=1, start_time=1, node="gpu-4", launch=Launch(
        program=["unshare", "--time", "--boottime", "-5", "--", "python", "-m", "agent", "--driver-version",
                 "550.90.07"], log="/dev/null"))
    write_state(SandboxState(stack="sandbox", run_id="r1", phase="up", base_dir=str(tmp_path), created_at=0.0,
                             agent_token_file=str(token), head_netns="h", slurm_conf="/s.conf",
                             processes=[agent]), tmp_path)
    return tmp_path


def _driver(root: Path, slurm: ScriptedSlurm) -> SlurmDriver:
    d = SlurmDriver("sandbox", Component.DRIVER, root, runner=slurm)
    d.record.mark = MARK
    return d


OLD_BOOT = "2000-01-01T00:00:00"
NEW_BOOT = "2099-01-01T00:00:00"  # later than any request this test makes


def test_a_reboot_stages_the_version_asks_slurm_and_waits_for_the_new_boot(
        up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = ScriptedSlurm([
        ("IDLE+DRAIN+REBOOT_REQUESTED", OLD_BOOT, MARK),
        ("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, MARK + " : reboot issued"),
        ("DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING", OLD_BOOT, MARK + " : reboot issued"),
        ("DOWN", NEW_BOOT, MARK + " : reboot issued : reboot complete"),
    ])
    d = _driver(up, slurm)
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.POLL_S", 0.0)
    monkeypatch.setattr(d, "version", lambda node: "570.124.06")
    assert d.reboot("gpu-4", "570.124.06", timeout_s=10) == "570.124.06"
    # Staged before the request: the agent's recipe boots into the new version, wrapper kept.
    program = read_state("sandbox", up).processes[0].launch.program
    assert program[:5] == ["unshare", "--time", "--boottime", "-5", "--"]
    assert program[-2:] == ["--driver-version", "570.124.06"]
    assert [*P, "scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={MARK}", "gpu-4"] in slurm.calls
    rec = d.report()["slurmReboots"][0]
    assert rec["outcome"] == "done" and rec["states"][-1] == "DOWN"
    assert "DOWN+DRAIN+REBOOT_ISSUED" in rec["states"]
    assert rec["bootTimeAfter"] > rec["bootTimeBefore"]


def test_a_reboot_slurm_gave_up_on_is_none(up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = ScriptedSlurm([
        ("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, MARK + " : reboot issued"),
        ("DOWN+DRAIN", OLD_BOOT, MARK + " : reboot issued : reboot timed out"),
    ])
    d = _driver(up, slurm)
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.POLL_S", 0.0)
    monkeypatch.setattr(d, "version", lambda node: "550.90.07")
    assert d.reboot("gpu-4", "570.124.06", timeout_s=10) is None
    assert d.report()["slurmReboots"][0]["outcome"] == "timed out"


def test_a_reboot_that_never_completes_ends_at_the_rollouts_timeout(up: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = ScriptedSlurm([("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, MARK + " : reboot issued")])
    d = _driver(up, slurm)
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.POLL_S", 0.01)
    assert d.reboot("gpu-4", "570.124.06", timeout_s=0.2) is None
    assert "rebootTimeoutSeconds" in d.report()["slurmReboots"][0]["outcome"]


def test_evict_requeues_what_may_be_requeued_and_cancels_the_rest(up: Path) -> None:
    slurm = ScriptedSlurm([("IDLE", OLD_BOOT, "")])
    _driver(up, slurm).evict(("7", "8"))
    assert [*P, "scontrol", "requeue", "7"] in slurm.calls
    assert [*P, "scancel", "8"] in slurm.calls


def test_uncordon_resumes_a_node_with_its_mark_and_slurms_suffixes_only(up: Path) -> None:
    slurm = ScriptedSlurm([("DOWN", NEW_BOOT, MARK + " : reboot issued : reboot complete")])
    d = _driver(up, slurm)
    d.record.nodes["gpu-4"] = "cordoned"
    assert d.uncordon("gpu-4") is True
    assert [*P, "scontrol", "update", "nodename=gpu-4", "state=RESUME"] in slurm.calls
    other = ScriptedSlurm([("DOWN+DRAIN", NEW_BOOT, "alice: bad DIMM")])
    d2 = _driver(up, other)
    assert d2.uncordon("gpu-4") is False
    assert not any("state=RESUME" in a for a in other.calls)


def test_uncordon_waits_until_slurm_shows_the_node_schedulable(
        up: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A ping that failed while slurmd was replaced leaves the resumed node `idle*` until the next one.
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.POLL_S", 0.0)
    slurm = ScriptedSlurm([("DOWN", NEW_BOOT, MARK + " : reboot issued : reboot complete")])
    slurm.after_resume = ["idle*", "idle*", "idle*", "idle"]
    assert _driver(up, slurm).uncordon("gpu-4") is True
    resumed_at = next(i for i, a in enumerate(slurm.calls) if "state=RESUME" in a)
    sinfos = [a for a in slurm.calls[resumed_at:] if a[len(P):][:1] == ["sinfo"]]
    assert len(sinfos) == 4 and slurm.after_resume == ["idle"]
    # Never schedulable within RETURN_WAIT_S: returned (it is resumed) with a warning that says so.
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.RETURN_WAIT_S", 0.0)
    stuck = ScriptedSlurm([("DOWN", NEW_BOOT, MARK + " : reboot issued : reboot complete")])
    stuck.after_resume = ["idle*"]
    with caplog.at_level("WARNING", logger="gpufleet.fleet.upgrade"):
        assert _driver(up, stuck).uncordon("gpu-4") is True
    assert "still shows it idle*" in caplog.text


def test_cleanup_lets_a_reboot_under_way_finish_before_starting_daemons(
        up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = ScriptedSlurm([
        ("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, MARK + " : reboot issued"),
        ("DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING", OLD_BOOT, MARK + " : reboot issued"),
        ("DOWN", NEW_BOOT, MARK + " : reboot issued : reboot complete"),
    ])
    slurm.i = 0  # the interrupted run had asked for the reboot
    d = _driver(up, slurm)
    monkeypatch.setattr("gpufleet.fleet.upgrade.slurm_driver.POLL_S", 0.0)
    started: list[int] = []

    def restart(_self: object, _node: str) -> list[str]:
        started.append(slurm.i)
        return []

    monkeypatch.setattr(SandboxDriver, "restart_missing_daemons", restart)
    d.restart_missing_daemons("gpu-4")
    assert started == [2]  # only once Slurm showed the reboot over


def test_a_silent_agent_is_unhealthy_only_after_reads_in_a_row(
        up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One failed read (a burst of readers, a loaded machine) does not take a node out of the
    rollout; AGENT_SILENT_READS in a row do, and an answer in between starts the count again."""
    from gpufleet.fleet.upgrade import sandbox_driver

    d = _driver(up, ScriptedSlurm([("IDLE", OLD_BOOT, "")]))
    answers: list[dict[str, object] | None] = [None, None, {"gpus": []}, None, None, None]
    monkeypatch.setattr(d, "agent_state", lambda node: answers.pop(0))
    seen = [d.health(["gpu-4"]) for _ in range(6)]
    assert sandbox_driver.AGENT_SILENT_READS == 3
    assert seen[:5] == [{}] * 5
    assert seen[5] == {"gpu-4": "the node agent does not answer (3 reads in a row)"}
    faulty = {"gpus": [{"index": 1, "fault": {"fault_id": "gpu-xid-79"}}]}
    monkeypatch.setattr(d, "agent_state", lambda node: faulty)
    assert d.health(["gpu-4"]) == {"gpu-4": "fault held by the health source: GPU 1: gpu-xid-79"}
