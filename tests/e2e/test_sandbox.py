"""End-to-end: the real sandbox (namespaces, Slurm, Prometheus, node agents, PyTorch training).

One sandbox is shared by the tests of this module (they run in file order and build on each
other: the XID test drains the idle compute nodes so the fabric test can prove the job moves to the
spare). Then `down` must leave nothing, also after `kill -9` of a half-way `up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import GPUFLEET, gpufleet, wait_until

from gpufleet.core.promapi import PrometheusClient
from gpufleet.core.sandbox_contract import SandboxState, read_controller_status, read_state
from gpufleet.core.slurm_state import SINFO_ARGS, NodeObs, parse_sinfo
from gpufleet.sandbox.agents import AgentClient

REPO = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox needs root (network namespaces, veth links, Slurm daemons)"
)


def leftovers(run_id: str, base_dir: str) -> dict[str, list[str]]:
    """Everything on this machine that still names the run."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = [p.name for p in Path("/sys/class/net").iterdir() if run_id in p.name]
    mounts = [line for line in Path("/proc/self/mounts").read_text().splitlines() if run_id in line]
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if base_dir.encode() in cmd and state != "Z":
            text = cmd.replace(b"\0", b" ").decode(errors="replace")
            procs.append(f"{entry.name}: {text[:120]}")
    return {
        "namespaces": [line for line in netns.splitlines() if run_id in line],
        "links": links,
        "mounts": mounts,
        "processes": procs,
    }


pytestmark = [pytest.mark.sandbox, needs_root, pytest.mark.timeout(600)]

STACK = "sandbox"


class Sandbox:
    def __init__(self, root: Path, state: SandboxState, up_seconds: float) -> None:
        self.root = root
        self.state = state
        self.up_seconds = up_seconds
        self.prom = PrometheusClient(state.prometheus_url or "", timeout=5)
        self.token = Path(state.agent_token_file or "").read_text().strip()

    def slurm(self, *args: str) -> str:
        res = subprocess.run(self.state.slurm_command(*args), capture_output=True, text=True, timeout=20)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def nodes(self) -> dict[str, NodeObs]:
        return parse_sinfo(self.slurm(*SINFO_ARGS))

    def job(self) -> dict[str, str]:
        """The training job's newest incarnation (the auto-resume controller submits each as a new
        job of the same name) as `scontrol show job` key=value pairs."""
        out = self.slurm("scontrol", "-o", "show", "job")
        jobs = [dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in out.splitlines()]
        ours = [kv for kv in jobs if kv.get("JobName") == self.state.training_job_name]
        if not ours:
            raise AssertionError(f"no job {self.state.training_job_name} in {out!r}")
        return max(ours, key=lambda kv: int(kv["JobId"]))

    def incarnation(self) -> int:
        return read_controller_status(Path(self.state.training_controller or "")).incarnation

    def job_nodes(self) -> list[str]:
        hosts = self.slurm("scontrol", "show", "hostnames", self.job()["NodeList"])
        return sorted(hosts.split())

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in Path(self.state.training_events or "").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def max_step(self) -> int:
        """Newest step the job completed (step events only: error events carry the failing step)."""
        return max((e["step"] for e in self.events() if e.get("event") == "step"), default=-1)

    def agent(self, node: str) -> AgentClient:
        sock = self.state.node(node).agent_socket
        assert sock is not None
        return AgentClient(sock, self.token)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, sandbox_rule_files: list[Path]) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("sbroot")
    rules = sandbox_rule_files
    t0 = time.monotonic()
    res = gpufleet(root, "sandbox", "up", "--stack", STACK, *[a for r in rules for a in ("--rules", str(r))])
    up_seconds = time.monotonic() - t0
    try:
        assert res.returncode == 0, f"sandbox up failed:\n{res.stdout}\n{res.stderr}"
        sb = Sandbox(root, read_state(STACK, root), up_seconds)
        yield sb
        sb.prom.close()
    finally:
        # Idempotent safety net; keeps the run directory (logs) when an earlier test failed.
        gpufleet(root, "sandbox", "down", "--stack", STACK, "--keep-files", timeout=120)


def test_up_gives_idle_nodes_live_targets_and_progressing_training(sandbox: Sandbox) -> None:
    st = sandbox.state
    assert st.phase == "up"
    assert [n.name for n in st.nodes if n.role != "head"] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert st.spare_nodes == ["gpu-4"]
    print(f"up took {sandbox.up_seconds:.1f} s")

    nodes = sandbox.nodes()
    job_nodes = sandbox.job_nodes()
    assert len(job_nodes) == 2 and "gpu-4" not in job_nodes  # the spare is used last
    for name, ns in nodes.items():
        assert ns.responding, name
        want = {"allocated", "mixed"} if name in job_nodes else {"idle"}
        assert ns.base_state in want, f"{name}: {ns}"

    def targets_up() -> list[dict[str, Any]] | None:
        ts = sandbox.prom.targets()
        jobs = {t["labels"]["job"] for t in ts}
        return ts if all(t["health"] == "up" for t in ts) and "training" in jobs else None

    targets = wait_until("every Prometheus target up (agents + training)", targets_up, 30)
    agents = sorted(t["labels"]["node"] for t in targets if t["labels"]["job"] == "dcgm")
    assert agents == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert all(
        t["labels"]["Hostname"] == t["labels"]["node"] for t in targets if t["labels"]["job"] == "dcgm"
    )
    xid = sandbox.prom.query("DCGM_FI_DEV_XID_ERRORS")
    assert len(xid) == 5 * 8  # 8 fake GPUs per node, dcgm-exporter's metric

    s0 = sandbox.max_step()
    wait_until("training steps advancing", lambda: sandbox.max_step() > s0, 20)


def test_second_up_of_the_same_stack_is_refused(sandbox: Sandbox) -> None:
    res = gpufleet(sandbox.root, "sandbox", "up", "--stack", STACK, timeout=60)
    assert res.returncode != 0
    assert "already exists" in res.stderr and sandbox.state.run_id in res.stderr
    assert read_state(STACK, sandbox.root).run_id == sandbox.state.run_id  # untouched


def test_xid79_drains_the_node_and_fires_the_catalog_alert(sandbox: Sandbox) -> None:
    job_nodes = sandbox.job_nodes()
    idle_compute = [n.name for n in sandbox.state.nodes if n.role == "compute" and n.name not in job_nodes]
    assert len(idle_compute) == 2
    for node in idle_compute:  # both idle compute nodes: the fabric test then needs the spare
        client = sandbox.agent(node)
        try:
            client.inject({"gpu": 3, "field_id": 230, "value": 79, "kmsg": True})
        finally:
            client.close()
    t_inject = time.time()

    def firing() -> list[dict[str, Any]] | None:
        alerts = [
            a
            for a in sandbox.prom.alerts()
            if a["labels"].get("alertname") == "GpuFallenOffBus" and a["state"] == "firing"
        ]
        hosts = {a["labels"].get("Hostname") for a in alerts}
        return alerts if set(idle_compute) <= hosts else None

    alerts = wait_until("GpuFallenOffBus firing for both nodes", firing, 30)
    assert all(a["labels"].get("gpu") == "3" for a in alerts)
    kern = Path(sandbox.state.node(idle_compute[0]).kernel_log or "").read_text()
    assert "NVRM: Xid" in kern and "79" in kern

    def drained() -> dict[str, NodeObs] | None:
        ns = sandbox.nodes()
        ok = all(ns[n].base_state in ("drained", "draining") for n in idle_compute)
        return ns if ok else None

    health = subprocess.run([GPUFLEET, "node-health", "--help"], capture_output=True, text=True)
    assert health.returncode == 0, "`gpufleet node-health` (the Slurm HealthCheckProgram) is not available"
    ns = wait_until("both injected nodes drained", drained, 30)
    for n in idle_compute:
        assert "79" in ns[n].reason, f"{n}: drain reason does not name XID 79: {ns[n].reason!r}"

    print(f"drain + alert within {time.time() - t_inject:.1f} s")
    # The training job was not on those nodes and keeps going.
    s0 = sandbox.max_step()
    wait_until("training still advancing", lambda: sandbox.max_step() > s0, 20)


def test_fabric_link_down_moves_the_job_to_the_spare_from_its_checkpoint(sandbox: Sandbox) -> None:
    from gpufleet.sandbox.training.checkpoint import CheckpointDir

    job_before = sandbox.job()
    restarts0 = sandbox.incarnation()
    nodes_before = sandbox.job_nodes()
    victim = nodes_before[-1]
    survivor = nodes_before[0]
    ckpts = CheckpointDir(Path(sandbox.state.checkpoint_dir or ""))
    wait_until("a first checkpoint", lambda: ckpts.keys(), 60)
    peer = sandbox.state.node(victim).fabric[0].peer
    t_cut = time.time()
    subprocess.run(["ip", "link", "set", peer, "down"], check=True)
    try:
        # The collective stalls: no step is reported for a while after the cut.
        time.sleep(3)
        stalled_at = sandbox.max_step()
        time.sleep(3)
        assert sandbox.max_step() == stalled_at, "training kept stepping with a fabric link down"

        def resubmitted_elsewhere() -> list[str] | None:
            job = sandbox.job()
            if sandbox.incarnation() <= restarts0 or job.get("JobState") != "RUNNING":
                return None
            # A new incarnation is a new job (ADR 0007), never the old JobId requeued.
            assert job["JobId"] != job_before["JobId"], job
            return sandbox.job_nodes()

        nodes_after = wait_until("the job running again as a new job", resubmitted_elsewhere, 120)
        assert victim not in nodes_after
        assert sorted(nodes_after) == sorted([survivor, "gpu-4"]), nodes_after
        vstate = sandbox.nodes()[victim]
        assert vstate.base_state in ("drained", "draining", "down"), vstate

        def resumed_steps() -> bool:
            return any(e.get("event") == "step" and int(e.get("restart", 0)) > restarts0
                       for e in sandbox.events())

        wait_until("the resubmitted job stepping", resumed_steps, 90)
        wait_until("training past the pre-cut step", lambda: sandbox.max_step() > stalled_at, 60)
        print(f"link down -> training past step {stalled_at} again in {time.time() - t_cut:.1f} s")
    finally:
        subprocess.run(["ip", "link", "set", peer, "up"], check=False)

    events = sandbox.events()
    resumes = [e for e in events if e.get("event") == "resume" and e.get("t", 0) > t_cut]
    after_cut = [
        {k: e.get(k) for k in ("event", "step", "restart", "job_id", "node", "rank", "message")}
        for e in events if e.get("t", 0) > t_cut
    ][:14]
    assert resumes, f"the new job did not resume from a checkpoint; events since the cut: {after_cut}"
    resumed_from = resumes[0]["step"]
    # The newest checkpoint the old incarnation wrote: a step or two may still complete between
    # t_cut and the moment `ip link` takes the link down, and one of them may be a checkpoint.
    old_ckpts = [e["step"] for e in events
                 if e.get("event") == "checkpoint" and int(e.get("restart", 0)) <= restarts0]
    assert resumed_from == max(old_ckpts), "resumed from an older checkpoint than the newest written"
    # Steps of each incarnation only go up.
    by_restart: dict[int, list[int]] = {}
    for e in events:
        if e.get("event") == "step" and e.get("rank") == 0:
            by_restart.setdefault(int(e["restart"]), []).append(int(e["step"]))
    for r, steps in by_restart.items():
        assert steps == sorted(steps), f"steps went backwards in restart {r}"
    # Every checkpoint on disk is intact (sha256 matches its manifest).
    keys = ckpts.keys()
    assert keys
    for key in keys:
        loaded = ckpts.load(key)
        assert not isinstance(loaded, str), f"checkpoint {key.stem} invalid: {loaded}"


def test_down_leaves_nothing_behind(sandbox: Sandbox) -> None:
    st = sandbox.state
    res = gpufleet(sandbox.root, "sandbox", "down", "--stack", STACK, timeout=120)
    assert res.returncode == 0, res.stderr
    left = leftovers(st.run_id, st.base_dir)
    assert left == {"namespaces": [], "links": [], "mounts": [], "processes": []}, left
    assert not Path(st.base_dir).exists()
    res = gpufleet(sandbox.root, "sandbox", "down", "--stack", STACK, timeout=60)  # idempotent
    assert res.returncode == 0 and "nothing to do" in res.stdout


def test_down_after_kill_9_of_up_half_way(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A short folder: slurmd's spool sockets live under it (layout.SUN_PATH_MAX; `up` refuses a
    # deeper one, and the test's own long name would make it too deep).
    root = tmp_path_factory.mktemp("k9") / "root"
    env_root = str(root)
    log = root.parent / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [GPUFLEET, "sandbox", "up", "--stack", STACK, "--no-training"],
            env={**os.environ, "GPUFLEET_SANDBOX_ROOT": env_root},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    state_file = root / STACK / "state.json"

    def half_way() -> SandboxState | None:
        if up.poll() is not None:  # `up` ended before it was killed: say why instead of timing out
            raise pytest.fail.Exception(f"`up` exited {up.returncode} early:\n{log.read_text()[-2000:]}")
        if not state_file.exists():
            return None
        st = read_state(STACK, root)
        return st if any(p.name.startswith("agent@") for p in st.processes) else None

    try:
        st = wait_until("`up` half-way (daemons starting)", half_way, 60, 0.05)
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=10)
    st = read_state(STACK, root)
    assert st.phase == "creating"
    before = leftovers(st.run_id, st.base_dir)
    assert before["namespaces"] and before["processes"], "nothing was running when up was killed"
    res = gpufleet(root, "sandbox", "down", "--stack", STACK, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    left = leftovers(st.run_id, st.base_dir)
    assert left == {"namespaces": [], "links": [], "mounts": [], "processes": []}, left
    assert not state_file.exists()
