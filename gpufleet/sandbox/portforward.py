"""A TCP forwarder from 127.0.0.1 in the root namespace to a port on a namespace's loopback.

The sandbox's bridges have no address in the root namespace (nothing routes into the sandbox), so
Prometheus in the head namespace is reached through this process: it accepts on the ROOT
namespace's loopback, and creates each outbound socket from a thread that entered the target
namespace with setns(2) (per-thread on Linux). Sockets keep the namespace they were created in.

Run: python -m gpufleet.sandbox.portforward --netns NAME --target-port 9090 --port-file FILE
(binds 127.0.0.1:0 unless --listen-port is given; writes the chosen port to --port-file).
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


class Forwarder:
    def __init__(self, target_netns: str, target_port: int, listen_port: int = 0) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", listen_port))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.target_port = target_port
        self._connector = netns.executor_in(target_netns)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def _connect(self) -> socket.socket:
        # Runs on the executor's thread, which lives in the target namespace.
        return socket.create_connection(("127.0.0.1", self.target_port), timeout=5)

    def _serve(self, client: socket.socket) -> None:
        try:
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.portforward")
    ap.add_argument("--netns", required=True)
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--listen-port", type=int, default=0)
    ap.add_argument("--port-file", type=Path, required=True)
    args = ap.parse_args(argv)
    fwd = Forwarder(args.netns, args.target_port, args.listen_port)
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(f"{fwd.port}\n")
    os.replace(tmp, args.port_file)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    fwd.serve_forever()


if __name__ == "__main__":
    main()
