"""The kubelet nodes' device plugin: its health rule, its allocation, and its gRPC conversation
(registration, ListAndWatch, Allocate, re-registration after a kubelet restart) against a
Registration service on a unix socket, as the kubelet serves it. The real kubelet is
tests/e2e/test_kubelet_node.py's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufleet.sandbox.agent.fields import gpu_uuid
from gpufleet.sandbox.kube import device_plugin as dp

RESOURCE = "nvidia.com/gpu"


def test_a_critical_xid_or_a_fatal_fault_makes_a_gpu_unhealthy_an_application_xid_does_not() -> None:
    assert dp.unhealthy({"xid": 79, "fatal": True})
    assert dp.unhealthy({"xid": 48, "fatal": False})  # NVIDIA's plugin: every XID but the skipped ones
    for xid in (13, 31, 43, 45, 68, 109):  # 109 (context switch timeout) is in v0.17.4's list
        assert not dp.unhealthy({"xid": xid, "fatal": False})
    assert dp.unhealthy({"xid": None, "fatal": True})  # a fault without an XID (another vendor's)
    assert not dp.unhealthy({"hung_since": 5.0})
    assert not dp.unhealthy(None) and not dp.unhealthy("x") and not dp.unhealthy({"xid": True})


def test_devices_are_the_agents_uuids_in_index_order() -> None:
    doc = {"node": "gpu-0", "gpus": {"2": {"xid": 79, "fatal": True}, "1": {"xid": 13}}}
    got = dp.device_health("gpu-0", 4, doc)
    assert [i for i, _ in got] == [gpu_uuid("gpu-0", i) for i in range(4)]
    assert [h for _, h in got] == [dp.HEALTHY, dp.HEALTHY, dp.UNHEALTHY, dp.HEALTHY]
    assert dp.device_health("gpu-0", 2, {"gpus": []}) == [(gpu_uuid("gpu-0", 0), dp.HEALTHY),
                                                        (gpu_uuid("gpu-0", 1), dp.HEALTHY)]


def test_allocation_names_the_chosen_devices_in_the_vendors_variable_and_refuses_strangers() -> None:
    known = ["a", "b", "c"]
    assert dp.allocation(RESOURCE, known, [["a", "c"], ["b"]]) == [
        {"NVIDIA_VISIBLE_DEVICES": "a,c"}, {"NVIDIA_VISIBLE_DEVICES": "b"}]
    assert dp.allocation("huawei.com/Ascend910", known, [["b"]]) == [{"ASCEND_VISIBLE_DEVICES": "b"}]
    assert dp.allocation("amd.com/gpu", known, [["b"]]) == [{}]
    with pytest.raises(ValueError, match="unknown device ID"):
        dp.allocation(RESOURCE, known, [["a", "z"]])
    assert dp.socket_name(RESOURCE) == "gpufleet-nvidia-com-gpu.sock"


class Kubelet:
    """The kubelet's Registration service on <dir>/kubelet.sock: records each RegisterRequest."""

    def __init__(self, folder: Path, refuse: int = 0) -> None:
        self.requests: list[Any] = []
        self.refuse = refuse  # refuse this many registrations first (a kubelet not ready yet)
        self.registered = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._register, request_deserializer=dp.message("RegisterRequest").FromString,
            response_serializer=dp.message("Empty").SerializeToString)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1beta1.Registration", {"Register": handler}),))
        self.server.add_insecure_port(f"unix://{folder / dp.KUBELET_SOCKET}")
        self.server.start()

    def _register(self, req: Any, ctx: Any) -> Any:
        self.requests.append(req)
        if len(self.requests) <= self.refuse:
            ctx.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
        self.registered.set()
        return dp.message("Empty")()

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Path, Path, Kubelet]]:
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    health = tmp_path / "gpu-health.json"
    health.write_text(json.dumps({"node": "gpu-0", "gpus": {}}))
    kubelet = Kubelet(folder)
    stop = threading.Event()
    t = threading.Thread(target=dp.serve, args=(folder, RESOURCE, dp.HealthSource(health, "gpu-0", 4), stop))
    t.start()
    try:
        assert kubelet.registered.wait(10)
        yield folder, health, kubelet
    finally:
        stop.set()
        t.join(10)
        kubelet.stop()


def stub(folder: Path, method: str, req: str, resp: str, stream: bool = False) -> Any:
    channel = grpc.insecure_channel(f"unix://{folder / dp.socket_name(RESOURCE)}")
    make = channel.unary_stream if stream else channel.unary_unary
    return make(f"/v1beta1.DevicePlugin/{method}", request_serializer=dp.message(req).SerializeToString,
                response_deserializer=dp.message(resp).FromString)


def test_it_registers_lists_watches_and_allocates_over_grpc(plugin: tuple[Path, Path, Kubelet]) -> None:
    folder, health, kubelet = plugin
    (req,) = kubelet.requests
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", dp.socket_name(RESOURCE), RESOURCE)
    watch = stub(folder, "ListAndWatch", "Empty", "ListAndWatchResponse", stream=True)(dp.message("Empty")())
    first = next(watch)
    assert [(d.ID, d.health) for d in first.devices] == [(gpu_uuid("gpu-0", i), dp.HEALTHY) for i in range(4)]
    # The agent marks GPU 2: the plugin sends the whole list again, GPU 2 Unhealthy.
    health.write_text(json.dumps({"node": "gpu-0", "gpus": {"2": {"xid": 79, "fatal": True}}}))
    second = next(watch)
    assert [d.health for d in second.devices] == [dp.HEALTHY, dp.HEALTHY, dp.UNHEALTHY, dp.HEALTHY]
    watch.cancel()

    allocate = stub(folder, "Allocate", "AllocateRequest", "AllocateResponse")
    ids = [gpu_uuid("gpu-0", 0), gpu_uuid("gpu-0", 3)]
    resp = allocate(dp.message("AllocateRequest")(
        container_requests=[dp.message("ContainerAllocateRequest")(devices_ids=ids)]))
    assert [dict(c.envs) for c in resp.container_responses] == [{"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}]
    with pytest.raises(grpc.RpcError) as e:
        allocate(dp.message("AllocateRequest")(
            container_requests=[dp.message("ContainerAllocateRequest")(devices_ids=["GPU-nope"])]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "GPU-nope" in (e.value.details() or "")


def test_it_registers_again_when_the_kubelet_starts_again(plugin: tuple[Path, Path, Kubelet]) -> None:
    folder, _, first = plugin
    first.stop()
    # A kubelet that starts again removes every socket in its folder, its own included.
    for sock in folder.iterdir():
        sock.unlink()
    again = Kubelet(folder)
    try:
        assert again.registered.wait(10)
        assert [r.resource_name for r in again.requests] == [RESOURCE]
        assert (folder / dp.socket_name(RESOURCE)).exists()
    finally:
        again.stop()


def test_a_refused_registration_is_tried_again_on_the_same_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    start = dp._start_server

    def counted(folder: Path, endpoint: str, plugin: dp.DevicePlugin) -> grpc.Server:
        started.append(endpoint)
        return start(folder, endpoint, plugin)

    monkeypatch.setattr(dp, "_start_server", counted)
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    health = tmp_path / "gpu-health.json"
    health.write_text(json.dumps({"node": "gpu-0", "gpus": {}}))
    kubelet = Kubelet(folder, refuse=3)
    stop = threading.Event()
    t = threading.Thread(target=dp.serve, args=(folder, RESOURCE, dp.HealthSource(health, "gpu-0", 4), stop))
    t.start()
    try:
        deadline = time.monotonic() + 10
        assert kubelet.registered.wait(10)
        while len(kubelet.requests) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(kubelet.requests) == 4  # three refused, then accepted
        assert started == [dp.socket_name(RESOURCE)]  # one server: the kubelet's endpoint never moved
        assert (folder / dp.socket_name(RESOURCE)).exists()
        time.sleep(3 * dp.POLL_S)
        assert len(kubelet.requests) == 4  # registered once accepted, not again
    finally:
        stop.set()
        t.join(10)
        kubelet.stop()


def test_bad_arguments_exit_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    health = tmp_path / "h.json"
    health.write_text("{}")
    base = ["--node", "n", "--resource", RESOURCE, "--health-file", str(health),
            "--plugin-dir", str(tmp_path / "d")]
    assert dp.main([*base, "--count", "0"]) == 2
    assert "--count 0: must be 1..16" in capsys.readouterr().err
    assert dp.main(["--node", "n", "--resource", "gpu", "--count", "8", "--health-file", str(health)]) == 2
    assert "<domain>/<name>" in capsys.readouterr().err
    assert dp.main(["--node", "n", "--resource", RESOURCE, "--count", "8", "--health-file",
                    str(tmp_path / "none.json")]) == 2
    assert "none.json: no such file" in capsys.readouterr().err
    assert dp.main([*base[:-1], str(tmp_path / "x" / "y"), "--count", "8"]) == 2
    assert "is not a folder" in capsys.readouterr().err
