"""The kubelet node's GPU device plugin: it advertises the node's GPUs to the real kubelet over the
kubelet's device plugin API (v1beta1, gRPC on unix sockets), with each GPU's health read from the
node's agent, as NVIDIA's device plugin reads it from NVML (ADR 0091).

The protocol, from the API's own definition (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 api.proto
and constants.go):
- the kubelet serves `Registration` on `/var/lib/kubelet/device-plugins/kubelet.sock`; a plugin
  serves `DevicePlugin` on a socket of its own in that folder and registers it (version `v1beta1`,
  the socket's file name as `endpoint`, the extended resource's name);
- the kubelet then calls `GetDevicePluginOptions`, and keeps `ListAndWatch` open: the plugin sends
  the whole device list (an ID and `Healthy` or `Unhealthy` each) at once and again at every change;
  the kubelet counts every device in the node's capacity and the healthy ones in its allocatable;
- before a container that asked for the resource starts, the kubelet calls `Allocate` with the
  device IDs it chose; the plugin answers what the container gets (here: the vendor's
  visible-devices variable, as NVIDIA's and Ascend's plugins set it);
- a kubelet that starts again removes every socket in the folder: the plugin serves its socket
  again and registers again (the API's "Failure Recovery").

The messages are described here as protobuf descriptors (names and field numbers from api.proto,
only the fields this plugin reads or writes: proto3 parsers skip the others), so no generated code
or protoc is needed.

Health: the node agent's gpu-health.json (gpufleet.sandbox.agent) is the node's GPU hardware. A GPU
there with an XID that is not an application error, or a fatal fault with no XID, is Unhealthy.
The application XIDs are those NVIDIA's device plugin skips (k8s-device-plugin v0.17.4, the newest
the module proxy serves, internal/rm/health.go `ignoredXids`: 13, 31, 43, 45, 68 and 109, "Application
errors: the GPU should still be healthy"). A GPU the agent has reset (its entry gone) is Healthy
again; NVIDIA's plugin keeps a GPU Unhealthy until it restarts (its server.go: "FIXME: there is no way
to recover from the Unhealthy state").

Run inside the node's mount namespace (where the kubelet's folder is):
    python -m gpufleet.sandbox.kube.device_plugin --node N --resource nvidia.com/gpu --count 8 \\
        --health-file <agent state>/gpu-health.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from gpufleet.core.node_health import NVIDIA_DEVICE_PLUGIN_SKIPPED_XIDS
from gpufleet.sandbox.agent.fields import gpu_uuid

log = logging.getLogger("gpufleet.device_plugin")

API_VERSION = "v1beta1"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # the kubelet's DevicePluginPath (constants.go)
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# The variable a container's runtime hook reads to expose the allocated devices: NVIDIA Container
# Toolkit's NVIDIA_VISIBLE_DEVICES; Ascend's device plugin's ASCEND_VISIBLE_DEVICES. AMD's device
# plugin passes device nodes (/dev/kfd, /dev/dri) instead, which a sandbox node has none of.
VISIBLE_DEVICES_ENV = {"nvidia.com/gpu": "NVIDIA_VISIBLE_DEVICES",
                       "huawei.com/Ascend": "ASCEND_VISIBLE_DEVICES"}
POLL_S = 0.25  # how often the health file and the kubelet's socket are looked at

_F = descriptor_pb2.FieldDescriptorProto
_STR, _BOOL, _MSG = _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
# Each message: (name, [(field, number, type, label, message type)]) as api.proto numbers them.
_MESSAGES: tuple[tuple[str, tuple[tuple[str, int, int, int, str], ...]], ...] = (
    ("Empty", ()),
    ("DevicePluginOptions", (("pre_start_required", 1, _BOOL, _ONE, ""),
                             ("get_preferred_allocation_available", 2, _BOOL, _ONE, ""))),
    ("RegisterRequest", (("version", 1, _STR, _ONE, ""), ("endpoint", 2, _STR, _ONE, ""),
                         ("resource_name", 3, _STR, _ONE, ""),
                         ("options", 4, _MSG, _ONE, "DevicePluginOptions"))),
    ("Device", (("ID", 1, _STR, _ONE, ""), ("health", 2, _STR, _ONE, ""))),
    ("ListAndWatchResponse", (("devices", 1, _MSG, _MANY, "Device"),)),
    ("ContainerAllocateRequest", (("devices_ids", 1, _STR, _MANY, ""),)),
    ("AllocateRequest", (("container_requests", 1, _MSG, _MANY, "ContainerAllocateRequest"),)),
    ("ContainerAllocateResponse", (("envs", 1, _MSG, _MANY, "ContainerAllocateResponse.EnvsEntry"),)),
    ("AllocateResponse", (("container_responses", 1, _MSG, _MANY, "ContainerAllocateResponse"),)),
    ("PreStartContainerRequest", (("devices_ids", 1, _STR, _MANY, ""),)),
    ("PreStartContainerResponse", ()),
)


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="gpufleet/deviceplugin_v1beta1.proto", package=API_VERSION,
                                           syntax="proto3")
    for name, fields in _MESSAGES:
        m = f.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            m.field.add(name=field, number=number, type=kind, label=label,
                        type_name=f".{API_VERSION}.{type_name}" if type_name else None)
        if name == "ContainerAllocateResponse":  # map<string, string> envs = 1
            entry = m.nested_type.add(name="EnvsEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_STR, label=_ONE)
            entry.field.add(name="value", number=2, type=_STR, label=_ONE)
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())


def message(name: str) -> Any:
    """The message class of api.proto's `name` (Empty, Device, AllocateResponse, ...). Any: a class
    made at run time from its descriptor, whose fields no type checker can know."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{API_VERSION}.{name}"))


# --------------------------------------------------------------------------- decisions (pure)


def unhealthy(entry: Any) -> bool:
    """Whether one GPU's entry of the agent's gpu-health.json makes it Unhealthy (module docstring)."""
    if not isinstance(entry, dict):
        return False
    xid = entry.get("xid")
    if isinstance(xid, int) and not isinstance(xid, bool):
        return xid not in NVIDIA_DEVICE_PLUGIN_SKIPPED_XIDS  # application errors leave it Healthy
    return entry.get("fatal") is True


def device_health(node: str, count: int, doc: Any) -> list[tuple[str, str]]:
    """(ID, health) of each of the node's `count` GPUs, in index order; IDs are the agent's UUIDs
    (the ones its metrics carry, as NVIDIA's plugin advertises NVML's)."""
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    entries = gpus if isinstance(gpus, dict) else {}
    return [(gpu_uuid(node, i), UNHEALTHY if unhealthy(entries.get(str(i))) else HEALTHY)
            for i in range(count)]


def visible_devices_env(resource: str) -> str | None:
    """The variable Allocate sets for `resource` (None: the vendor's plugin sets none)."""
    for prefix, env in VISIBLE_DEVICES_ENV.items():
        if resource.startswith(prefix):
            return env
    return None


def allocation(resource: str, known: Sequence[str],
               requests: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """Each container's variables for the device IDs the kubelet chose; an ID this plugin never
    advertised is an error (ValueError), as the kubelet should only hand out ours."""
    env = visible_devices_env(resource)
    out: list[dict[str, str]] = []
    for ids in requests:
        strange = [i for i in ids if i not in known]
        if strange:
            raise ValueError(f"unknown device ID(s): {', '.join(strange)}")
        out.append({env: ",".join(ids)} if env else {})
    return out


def socket_name(resource: str) -> str:
    """The plugin's socket in the kubelet's folder, named after the resource (one plugin each)."""
    return "gpufleet-" + "".join(c if c.isalnum() else "-" for c in resource) + ".sock"


# --------------------------------------------------------------------------- I/O


class HealthSource:
    """The agent's gpu-health.json, re-read when it changes; an unreadable read keeps the last."""

    def __init__(self, path: Path, node: str, count: int) -> None:
        self.path, self.node, self.count = path, node, count
        self._seen: tuple[int, int] | None = None
        self._doc: Any = {}

    def devices(self) -> list[tuple[str, str]]:
        try:
            st = self.path.stat()
            key = (st.st_mtime_ns, st.st_ino)
            if key != self._seen:
                self._doc = json.loads(self.path.read_text())
                self._seen = key
        except (OSError, ValueError) as e:
            log.warning("reading %s: %s (keeping the last state)", self.path, e)
        return device_health(self.node, self.count, self._doc)


class DevicePlugin:
    """The DevicePlugin service for one resource."""

    def __init__(self, resource: str, health: HealthSource, stop: threading.Event) -> None:
        self.resource, self.health, self.stop = resource, health, stop

    def options(self, _req: Message, _ctx: grpc.ServicerContext) -> Message:
        opts: Message = message("DevicePluginOptions")()
        return opts

    def list_and_watch(self, _req: Message, ctx: grpc.ServicerContext) -> Iterator[Message]:
        last: list[tuple[str, str]] | None = None
        while not self.stop.is_set() and ctx.is_active():
            now = self.health.devices()
            if now != last:
                log.info("%s: %s", self.resource, ", ".join(f"{i} {h}" for i, h in now))
                yield message("ListAndWatchResponse")(
                    devices=[message("Device")(ID=i, health=h) for i, h in now])
                last = now
            self.stop.wait(POLL_S)

    def allocate(self, req: Any, ctx: grpc.ServicerContext) -> Message:
        known = [i for i, _ in self.health.devices()]
        try:
            envs = allocation(self.resource, known, [list(c.devices_ids) for c in req.container_requests])
        except ValueError as e:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log.info("allocate %s", [list(c.devices_ids) for c in req.container_requests])
        resp: Message = message("AllocateResponse")(
            container_responses=[message("ContainerAllocateResponse")(envs=e) for e in envs])
        return resp

    def pre_start(self, _req: Message, _ctx: grpc.ServicerContext) -> Message:
        done: Message = message("PreStartContainerResponse")()
        return done

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, req: str, resp: str) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=message(req).FromString,
                response_serializer=message(resp).SerializeToString)

        return grpc.method_handlers_generic_handler(f"{API_VERSION}.DevicePlugin", {
            "GetDevicePluginOptions": unary(self.options, "Empty", "DevicePluginOptions"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.list_and_watch, request_deserializer=message("Empty").FromString,
                response_serializer=message("ListAndWatchResponse").SerializeToString),
            "Allocate": unary(self.allocate, "AllocateRequest", "AllocateResponse"),
            "PreStartContainer": unary(self.pre_start, "PreStartContainerRequest",
                                       "PreStartContainerResponse"),
        })


def register(plugin_dir: Path, resource: str, endpoint: str, timeout_s: float = 10.0) -> None:
    """Register with the kubelet's Registration service (grpc.RpcError when it refuses)."""
    with grpc.insecure_channel(f"unix://{plugin_dir / KUBELET_SOCKET}") as channel:
        call = channel.unary_unary(f"/{API_VERSION}.Registration/Register",
                                   request_serializer=message("RegisterRequest").SerializeToString,
                                   response_deserializer=message("Empty").FromString)
        call(message("RegisterRequest")(version=API_VERSION, endpoint=endpoint, resource_name=resource,
                                        options=message("DevicePluginOptions")()), timeout=timeout_s)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


def _start_server(plugin_dir: Path, endpoint: str, plugin: DevicePlugin) -> grpc.Server:
    (plugin_dir / endpoint).unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((plugin.handler(),))
    server.add_insecure_port(f"unix://{plugin_dir / endpoint}")
    server.start()
    return server


def serve(plugin_dir: Path, resource: str, health: HealthSource, stop: threading.Event) -> None:
    """Serve and register; register again whenever the kubelet's socket is a new one, and serve
    again first when our own socket is gone (a kubelet that starts empties the folder), until
    `stop`. A refused registration is retried on the same server."""
    endpoint = socket_name(resource)
    kubelet = plugin_dir / KUBELET_SOCKET
    plugin = DevicePlugin(resource, health, stop)
    registered: tuple[int, int] | None = None
    server: grpc.Server | None = None
    while not stop.is_set():
        now = _identity(kubelet)
        if now is not None and now != registered:
            if server is None or not (plugin_dir / endpoint).exists():
                if server is not None:
                    server.stop(grace=None)
                server = _start_server(plugin_dir, endpoint, plugin)
            try:
                register(plugin_dir, resource, endpoint)
            except grpc.RpcError as e:
                log.warning("registering %s with the kubelet: %s (trying again)", resource, e)
            else:
                registered = now
                log.info("registered %s as %s", resource, endpoint)
        stop.wait(POLL_S)
    if server is not None:
        server.stop(grace=1.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.kube.device_plugin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True, help="the node's name (its GPUs' UUIDs derive from it)")
    p.add_argument("--resource", required=True, help="the extended resource: nvidia.com/gpu, ...")
    p.add_argument("--count", required=True, type=int, help="GPUs on the node (1..16, as the agent's)")
    p.add_argument("--health-file", required=True, type=Path, help="the node agent's gpu-health.json")
    p.add_argument("--plugin-dir", type=Path, default=PLUGIN_DIR, help="the kubelet's device plugin folder")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=env.get("GPUFLEET_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if not 1 <= args.count <= 16:
        print(f"error: --count {args.count}: must be 1..16", file=sys.stderr)
        return 2
    if "/" not in args.resource:
        print(f"error: --resource {args.resource!r}: an extended resource is <domain>/<name>",
              file=sys.stderr)
        return 2
    if not args.health_file.is_file():
        print(f"error: --health-file {args.health_file}: no such file (is the node agent running?)",
              file=sys.stderr)
        return 2
    if not args.plugin_dir.parent.is_dir():  # the kubelet makes the folder itself when it starts
        print(f"error: --plugin-dir {args.plugin_dir}: {args.plugin_dir.parent} is not a folder (run in the "
              "kubelet's mount namespace)", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.plugin_dir, args.resource, HealthSource(args.health_file, args.node, args.count), stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
