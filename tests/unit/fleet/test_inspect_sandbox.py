"""The sandbox source's pure part (an agent's /state document -> an observation), the bandwidth
probe on loopback, and the CLI's edges."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog, xid_policy
from gpufleet.cli.main import app
from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.fleet.inspect import bwprobe
from gpufleet.fleet.inspect.checks import Context, check_node
from gpufleet.fleet.inspect.sandbox import observation_from_agent
from gpufleet.fleet.inspect.slurm_cluster import sched_state_of
from gpufleet.fleet.inspect.thresholds import load_thresholds

# The shape of GET /state (gpufleet.sandbox.agent.runtime.Agent.state_doc), one GPU shortened.
DOC: dict[str, Any] = {
    "node": "gpu-1", "vendor": "nvidia", "model_name": "NVIDIA H100 80GB HBM3", "now": 2000.0,
    "gpus": [
        {"index": 0, "fields": {"310": 250.0}, "metrics": {}, "xid_counts": {"79": 1}, "fault": None,
         "reset_at": 1500.0, "uuid": "GPU-x", "pci_bus_id": "00000000:18:00.0", "busy": False},
        {"index": 1, "fields": {"396": 1.0}, "metrics": {}, "xid_counts": {},
         "fault": {"fatal": False, "fault_id": "gpu-row-remap-pending", "xid": None, "title": "t",
                   "error": "e", "since": 1900.0, "kills_process": False},
         "reset_at": None},
    ],
    "events": [{"gpu": 0, "xid": 79, "at": 1400.0}, {"gpu": 0, "xid": 13, "at": 1600.0}],
    "fabric": [{"ifname": "fab0", "present": True, "operstate": "up", "up": True, "carrier_changes": 6,
                "rate_bytes_per_second": 42_500_000.0}],
    "host": {},
}


def obs(doc: dict[str, Any] = DOC) -> Any:
    return observation_from_agent(doc, node="gpu-1", pool="gpu", sku=AcceleratorModel.H100_SXM,
                                  expected_gpus=2, expected_port_gbps=100.0, sched_state="idle", at=2000.0)


def test_agent_document_to_observation() -> None:
    o = obs()
    g0, g1 = o.gpus
    assert g0.xids == (13,)  # XID 79 came before the GPU's reset: history, not a current fault
    assert g0.ecc_correctable_volatile == 250.0 and g1.row_remap_pending == 1.0
    assert g0.health_fault is None and g1.health_fault == "gpu-row-remap-pending"
    (port,) = o.ports
    assert port.carrier_changes == 6 and port.speed_gbps == pytest.approx(0.34)
    assert "pcie" in o.not_observable and "driver" in o.not_observable


def test_the_sandbox_observation_through_the_checks() -> None:
    rules, _ = xid_policy(load_catalog(), {})
    cat = load_catalog()
    ctx = Context(load_thresholds(), rules, fault_actions={f.id: f.action for f in cat})
    r = check_node(obs(), None, ctx, run_full=False)
    # GPU 1's held fault is the remap-pending field's own: reported once, as GFI010
    assert {f.code for f in r.findings} == {"GFI003", "GFI010", "GFI032"}
    assert r.status == "fail" and any(s.startswith("pcie: the sandbox") for s in r.skipped)


def test_reported_versions_are_compared() -> None:
    o = obs({**DOC, "driver_version": "570.124.06", "firmware_version": "fw-1"})
    assert o.driver_version == "570.124.06" and "driver" not in o.not_observable


@pytest.mark.parametrize(("slurm", "plan"), [
    ("idle", "idle"), ("drained", "drained"), ("down*", "down"), ("allocated", "allocated"),
    ("mixed", "mixed"), ("draining", "draining"), ("future", "unknown"), (None, "unknown")])
def test_slurm_states(slurm: str | None, plan: str) -> None:
    assert sched_state_of(slurm) == plan


def test_probe_offers_at_most_its_rate_on_loopback() -> None:
    got: dict[str, float] = {}
    t = threading.Thread(target=lambda: got.update(bwprobe.recv("127.0.0.1", 52011, 10)))
    t.start()
    for _ in range(50):  # the receiver binds in its thread
        try:
            bwprobe.send("127.0.0.1", 52011, 0.5, 80.0)
            break
        except ConnectionRefusedError:
            threading.Event().wait(0.02)
    t.join(15)
    assert got["bytes"] > 0
    assert got["mbit_per_s"] <= 80.0 * 1.15  # paced: never more than offered (one slice of slack)


def test_cli_without_a_running_sandbox_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(tmp_path))
    res = CliRunner().invoke(app, ["inspect", "--stack", "sandbox"])
    assert res.exit_code == 2 and "no running sandbox for stack sandbox" in res.output


def test_cli_npd_needs_a_node() -> None:
    res = CliRunner().invoke(app, ["inspect", "--format", "npd"])
    assert res.exit_code == 2 and "--node" in res.output
