"""The one teardown of recorded runs (gpufleet.sandbox.run_teardown): the stop order it keeps.

Removing the folder and the state file, strays and idempotence are covered through its two users,
kube_down (test_kube_sandbox.py) and storage_down (test_storage_cli_and_doctor.py), with real
processes."""

from __future__ import annotations

import pytest

from gpufleet.core.sandbox_contract import Launch, SandboxProcess
from gpufleet.sandbox import processes, run_teardown
from gpufleet.sandbox.kube import cluster
from gpufleet.sandbox.storage import ceph


def _proc(name: str, pid: int) -> SandboxProcess:
    return SandboxProcess(name=name, pid=pid, start_time=pid, launch=Launch(program=["x"], log="/dev/null"))


def _stopped_in(
    order: tuple[str | None, ...], names: list[str], monkeypatch: pytest.MonkeyPatch
) -> list[list[str]]:
    """The names stop_in_order stops, one list per stop_pids call (a tier), strays left out."""
    by_pid = {i + 100: n for i, n in enumerate(names)}
    calls: list[list[str]] = []

    def stop_pids(pids: dict[int, int], grace_s: float = 5.0) -> list[int]:
        calls.append([by_pid[p] for p in pids])
        return []

    monkeypatch.setattr(processes, "alive", lambda p: True)
    monkeypatch.setattr(processes, "stop_pids", stop_pids)
    monkeypatch.setattr(processes, "pids_mentioning", lambda text, programs: {})
    recorded = [_proc(n, pid) for pid, n in by_pid.items()]
    stopped, left = run_teardown.stop_in_order(recorded, order, "/run-x", frozenset(), 1.0)
    assert (stopped, left) == (len(names), [])
    return [c for c in calls if c]


def test_kubernetes_clients_first_then_the_api_server_then_etcd(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["etcd", "kube-apiserver", "kube-scheduler", "kwok", "kueue"]
    assert _stopped_in(cluster.STOP_ORDER, names, monkeypatch) == [
        ["kube-scheduler", "kwok", "kueue"],
        ["kube-apiserver"],
        ["etcd"],
    ]


def test_ceph_clients_first_and_the_monitor_last(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["ceph-mon.a", "ceph-mgr.x", "ceph-osd.0", "ceph-osd.1", "radosgw", ceph.WRITER, "other"]
    assert _stopped_in(ceph.STOP_ORDER, names, monkeypatch) == [
        [ceph.WRITER],
        ["radosgw"],
        ["ceph-osd.0", "ceph-osd.1"],
        ["ceph-mgr.x"],
        ["ceph-mon.a"],
        ["other"],  # what no prefix names goes where None stands: last here
    ]


def test_an_order_without_a_place_for_the_rest_is_refused() -> None:
    with pytest.raises(ValueError, match="unnamed processes"):
        run_teardown.stop_in_order([], ("etcd",), "/run-x", frozenset(), 1.0)
