"""End-to-end: a killed run's namespaces and links, which no state file records, are listed by
`gpufleet sandbox doctor` and removed by `gpufleet sandbox down --leftovers`; a run with a process
in its namespace (another state root's sandbox, running now) is listed as live and left alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import gpufleet

from gpufleet.sandbox import layout, network

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]
DEAD, LIVE = "d0d0d0", "e1e1e1"


@pytest.fixture
def debris() -> Iterator[subprocess.Popen[bytes]]:
    """A dead run (two namespaces, a bridge, a veth pair with one end in a namespace) and a live one
    (a namespace with a sleeping process)."""
    dead_ns = [layout.netns_name(DEAD, "head"), layout.netns_name(DEAD, "gpu-0")]
    live_ns = layout.netns_name(LIVE, "gpu-0")
    bridge, peer = layout.mgmt_bridge(DEAD), layout.mgmt_peer(DEAD, 0)
    network.ip_batch([*(f"netns add {ns}" for ns in [*dead_ns, live_ns]), f"link add {bridge} type bridge",
                      f"link add {peer} type veth peer name {peer}x netns {dead_ns[1]}"])
    sleeper = subprocess.Popen(["ip", "netns", "exec", live_ns, "sleep", "120"])
    try:
        yield sleeper
    finally:
        sleeper.kill()
        sleeper.wait()
        network.remove([*dead_ns, live_ns], [bridge], [peer])


def test_doctor_lists_and_down_removes_only_the_dead_run(debris: subprocess.Popen[bytes], tmp_path: Path
                                                         ) -> None:
    doctor = gpufleet(tmp_path, "sandbox", "doctor")
    said = " ".join(doctor.stdout.split())
    assert f"leftover run {DEAD}: 2 namespace(s), 2 link(s)" in said, said
    assert "fix: gpufleet sandbox down --leftovers" in said
    assert f"live run {LIVE}: 1 process(es) in 1 namespace(s)" in said
    assert doctor.returncode == 1  # a leftover is a problem the doctor names

    down = gpufleet(tmp_path, "sandbox", "down", "--leftovers")
    said = " ".join(down.stdout.split())
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"run {DEAD}: removed 2 namespace(s), 2 link(s)" in said
    assert f"run {LIVE}: 1 process(es) run in its namespaces" in said
    names = network.existing_netns()
    assert not {n for n in names if n.startswith(f"gf-{DEAD}-")}
    assert not {n for n in network.existing_links() if n.startswith(f"gf{DEAD}")}
    assert layout.netns_name(LIVE, "gpu-0") in names and debris.poll() is None
