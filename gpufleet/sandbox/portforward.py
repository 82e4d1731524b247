"""TCP forwarders between the root namespace's loopback and a sandbox namespace's loopback.

The sandbox's bridges have no address in the root namespace (nothing routes into the sandbox), so
Prometheus in the head namespace is reached through this process: it accepts on the ROOT
namespace's loopback, and creates each outbound socket from a thread that entered the target
namespace with setns(2) (per-thread on Linux). Sockets keep the namespace they were created in. The
same way, a kubelet node's kubelet reaches containerd's streaming server in the node's namespace
(`--netns /proc/<pid>/ns/net`, ADR 0090).

The other way (`--out-of`), a namespace's processes reach one service of the root namespace's
loopback on their own 127.0.0.1: the training job reaches the storage sandbox's radosgw so, when its
checkpoints go straight to S3 (ADR 0070). Nothing is routed; only that port is relayed.

Run: python -m gpufleet.sandbox.portforward --netns NAME --target-port 9090 --port-file FILE
(binds 127.0.0.1:0 unless --listen-port is given; writes the chosen port to --port-file), or
--out-of NETNS [--out-of NETNS ...] --listen-port 7480 --target-port <radosgw> --port-file FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
from pathlib import Path

from gpufleet.core import netns

BUF = 65536
MAX_CONNECTIONS = 256  # bound the number of relay threads


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)


def _listen(port: int) -> socket.socket:
    """A listener on 127.0.0.1 of the calling thread's namespace."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


class Forwarder:
    """Accepts on `listener` and relays each connection to 127.0.0.1:`target_port` of the target
    namespace (None: this process's own, the root namespace)."""

    def __init__(self, listener: socket.socket, target_port: int, target_netns: str | None) -> None:
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        self.target_port = target_port
        self._connector = netns.executor_in(target_netns) if target_netns else None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def _connect(self) -> socket.socket:
        # On the executor's thread (in the target namespace) or, without one, on the caller's.
        return socket.create_connection(("127.0.0.1", self.target_port), timeout=5)

    def _serve(self, client: socket.socket) -> None:
        try:
            if self._connector is None:
                upstream = self._connect()
            else:
                upstream = self._connector.submit(self._connect).result(timeout=10)
        except Exception:
            client.close()
            self._slots.release()
            return
        upstream.settimeout(None)
        t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        t.start()
        _pump(client, upstream)
        t.join()
        client.close()
        upstream.close()
        self._slots.release()

    def serve_forever(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if not self._slots.acquire(timeout=10):
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()


def into(target_netns: str, target_port: int, listen_port: int = 0) -> Forwarder:
    """Root namespace's loopback -> a namespace's loopback (Prometheus in the head namespace)."""
    return Forwarder(_listen(listen_port), target_port, target_netns)


def out_of(listen_netns: str, listen_port: int, target_port: int) -> Forwarder:
    """A namespace's loopback -> the root namespace's loopback: a service of the root namespace
    (the storage sandbox's radosgw) on a port of the namespace's own 127.0.0.1, and nowhere else.
    The listener is created by a thread inside the namespace (it keeps that namespace); each
    outbound socket by a thread of this process, in the root namespace."""
    return Forwarder(netns.run_in(listen_netns, lambda: _listen(listen_port)), target_port, None)


def _write_port(path: Path, port: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.portforward")
    ap.add_argument("--netns", help="into: the namespace whose loopback port to reach")
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--listen-port", type=int, default=0)
    ap.add_argument("--out-of", action="append", default=[], metavar="NETNS",
                    help="out of: listen on --listen-port of this namespace's loopback (repeatable) "
                    "and reach --target-port of the root namespace's")
    ap.add_argument("--port-file", type=Path, required=True)
    args = ap.parse_args(argv)
    if bool(args.netns) == bool(args.out_of):
        ap.error("give --netns or --out-of")
    if args.netns:
        forwarders = [into(args.netns, args.target_port, args.listen_port)]
    else:
        if not args.listen_port:
            ap.error("--out-of needs --listen-port (the port every namespace's clients are told)")
        forwarders = [out_of(ns, args.listen_port, args.target_port) for ns in args.out_of]
    for f in forwarders[1:]:
        threading.Thread(target=f.serve_forever, daemon=True).start()
    _write_port(args.port_file, forwarders[0].port)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    forwarders[0].serve_forever()


if __name__ == "__main__":
    main()
