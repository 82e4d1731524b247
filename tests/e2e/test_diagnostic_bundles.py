"""End-to-end: a GPU fault (XID 79) on one sandbox node; the node-health check collects the node's
diagnostic bundle before it drains the node.

The bundle must exist for that node, have been finished before the drain (its own `scontrol show
node` still shows the node undrained, and its finish time is before the drain's timestamp), hold the
agent state with the XID, the node's daemon logs and the metrics window, stay within its caps, and
verify (`gpufleet bundle show`). `gpufleet bundle collect` by hand works on the same node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from e2e_support import gpufleet, sandbox_up, wait_until

from gpufleet.core.agent_client import agent_request
from gpufleet.core.sandbox_contract import SandboxState, read_state
from gpufleet.fleet.bundle.archive import read_manifest, verify

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox needs root (network namespaces, veth links, Slurm daemons)"
)
pytestmark = [pytest.mark.sandbox, needs_root, pytest.mark.timeout(600)]
STACK = "sandbox"
NODE = "gpu-2"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SandboxState]]:
    root = tmp_path_factory.mktemp("sbroot")
    with sandbox_up(root, STACK, "--no-training"):
        yield root, read_state(STACK, root)


def node_line(state: SandboxState, node: str) -> str:
    return subprocess.run(state.slurm_command("scontrol", "-o", "show", "node", node), capture_output=True,
                          text=True, timeout=20).stdout


def drained_at(line: str) -> float | None:
    """The drain's time from Slurm's reason stamp `[user@YYYY-MM-DDTHH:MM:SS]` (local time)."""
    if "DRAIN" not in line:
        return None
    m = re.search(r"Reason=.*\[\w+@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]", line)
    assert m, line
    return datetime.fromisoformat(m.group(1)).timestamp()


def healthy_xid_scraped(state: SandboxState) -> bool:
    query = f'DCGM_FI_DEV_XID_ERRORS{{node="{NODE}",gpu="3"}}'
    r = httpx.get(f"{state.prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    result = r.json()["data"]["result"] if r.status_code == 200 else []
    return any(float(x["value"][1]) == 0.0 for x in result)


def test_xid79_bundle_is_collected_before_the_drain(sandbox: tuple[Path, SandboxState], tmp_path: Path
                                                     ) -> None:
    root, state = sandbox
    bundles = Path(state.base_dir) / "bundles"
    token = Path(state.agent_token_file or "").read_text().strip()
    sock = Path(state.node(NODE).agent_socket or "")
    # Let Prometheus hold scrapes of the healthy GPU first, so the window has a before: wait until it
    # answers with the series at 0 (a fixed 5 s was not always enough: a CI run saw only 79s).
    wait_until("Prometheus holds the healthy XID series", lambda: healthy_xid_scraped(state), 60)
    time.sleep(2)  # and one more scrape of it
    t_inject = time.time()
    agent_request(sock, token, "POST", "/inject", {"gpu": 3, "field_id": 230, "value": 79, "kmsg": True})
    try:
        line = wait_until(f"{NODE} drained", lambda: (ln := node_line(state, NODE)) and drained_at(ln) and ln,
                          120)
        drain_t = drained_at(line)
        assert drain_t is not None and "79" in line
        files = sorted(bundles.glob(f"bundle-{NODE}-*-node-health.tar.gz"))
        assert len(files) == 1, f"expected one bundle for {NODE}, found {files}"
        others = [p.name for p in bundles.glob("bundle-*.tar.gz") if f"-{NODE}-" not in p.name]
        assert others == [], f"bundles for nodes without a fault: {others}"
        manifest, problems = verify(files[0])
        assert problems == []
        assert manifest.node == NODE and manifest.trigger == "node-health"
        assert manifest.reason is not None and "79" in manifest.reason
        # Made before the drain: Slurm stamps the drain to the second.
        assert t_inject <= manifest.started_at and manifest.finished_at < drain_t + 1.0, (
            manifest.started_at, manifest.finished_at, drain_t)
        took = manifest.finished_at - manifest.started_at
        assert took <= manifest.caps.deadline_s + 1.0
        assert manifest.total_bytes <= manifest.caps.total_bytes
        assert all(m.size <= manifest.caps.collector_bytes for m in manifest.members)
        statuses = {m.collector: m.status for m in manifest.members}
        # What the test reads must have been collected whole; a slower collector on a loaded machine may
        # time out, and then its manifest entry says so.
        for needed in ("agent-state", "gpu-health", "kernel-log", "slurm-node", "fabric-links", "metrics",
                       f"log:slurmd@{NODE}", f"log:agent@{NODE}"):
            assert statuses.get(needed) == "ok", statuses
        assert all(m.error for m in manifest.members if m.status != "ok"), manifest.members
        with tarfile.open(files[0]) as tar:
            def member(name: str) -> bytes:
                fh = tar.extractfile(name)
                assert fh is not None
                return fh.read()

            agent = json.loads(member("agent/state.json"))
            assert any(e.get("xid") == 79 for e in agent.get("events", [])), agent.get("events")
            assert b"79" in member("agent/gpu-health.json")
            assert b"NVRM: Xid" in member("kernel/kern.log")
            # Slurm's view as it was when the bundle was made: not yet drained.
            assert b"DRAIN" not in member("slurm/scontrol-show-node.txt")
            assert f"NodeName={NODE}".encode() in member("slurm/scontrol-show-node.txt")
            links = member("fabric/ip-link.txt").decode()
            assert all(f.ifname in links for f in state.node(NODE).fabric)
            logs = [n for n in tar.getnames() if n.startswith("logs/")]
            assert f"logs/slurmd@{NODE}.log" in logs and f"logs/agent@{NODE}.log" in logs, logs
            metrics = json.loads(member("metrics/query_range.json"))
            series = metrics["result"]
            assert series and all(s["metric"].get("node") == NODE for s in series)
            xid = [s for s in series if s["metric"].get("__name__") == "DCGM_FI_DEV_XID_ERRORS"
                   and s["metric"].get("gpu") == "3"]
            assert xid, "no XID series in the metrics window"
            assert metrics["start"] <= t_inject - 60 and metrics["end"] >= manifest.detected_at
            values = [float(v) for _, v in xid[0]["values"]]
            assert 0.0 in values, "the window holds no scrape from before the fault"
        print(f"bundle {files[0].name}: {manifest.total_bytes} bytes in {took:.2f} s; "
              f"drained {drain_t - t_inject:.1f} s after the injection")
        # The hook runs once per fault: later checks of the drained node add none.
        time.sleep(12)
        assert len(list(bundles.glob(f"bundle-{NODE}-*.tar.gz"))) == 1
    finally:
        agent_request(sock, token, "POST", "/clear", {"gpu": None})
        subprocess.run(state.slurm_command("scontrol", "update", f"nodename={NODE}", "state=resume"),
                       capture_output=True, timeout=20)
    # By hand, with the CLI; and show verifies it.
    res = gpufleet(root, "bundle", "collect", "--stack", STACK, "--node", "gpu-0", "--out", str(tmp_path),
                   "--since", "2m", "--json")
    assert res.returncode == 0, res.stderr
    path = Path(json.loads(res.stdout)["path"])
    assert read_manifest(path).node == "gpu-0"
    shown = gpufleet(root, "bundle", "show", str(path))
    assert shown.returncode == 0 and "verified" in shown.stdout, shown.stdout + shown.stderr
    bad = gpufleet(root, "bundle", "collect", "--stack", STACK, "--node", "nope", "--out", str(tmp_path))
    assert bad.returncode == 2 and "no node 'nope'" in bad.stderr
