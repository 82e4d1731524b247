"""A TCP bandwidth probe between two sandbox nodes over their fabric veths: `recv` in one node's
network namespace, `send` in the other's (`ip netns exec`). Real bytes through the real kernel
path (veth, bridge, any tc qdisc on the port); the receiver reports what arrived.

The sender offers at most `--rate-mbit` (paced in 10 ms slices): unpaced, veth throughput is bound
by the shared CPUs and swings with whatever else runs; paced, a healthy port carries the offered
rate and a port whose tc tbf caps it lower shows exactly that cap. The offered rate is the
sandbox's stand-in for a line rate (docs/fleet-inspect.md).

    python -m gpufleet.fleet.inspect.bwprobe recv --bind 10.77.1.2 --port 5201 --timeout 20
    python -m gpufleet.fleet.inspect.bwprobe send --to 10.77.1.2 --port 5201 --seconds 2 --rate-mbit 400
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

CHUNK = 64 * 1024
SLICE_S = 0.01


def recv(bind: str, port: int, timeout: float) -> dict[str, float]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind, port))
        srv.listen(1)
        srv.settimeout(timeout)
        print(json.dumps({"listening": port}), flush=True)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout)
            total, first, last = 0, None, None
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                now = time.monotonic()
                first = now if first is None else first
                last = now
                total += len(data)
    secs = (last - first) if first is not None and last is not None else 0.0
    return {"bytes": float(total), "seconds": secs,
            "mbit_per_s": (total * 8 / 1e6 / secs) if secs > 0 else 0.0}


def send(to: str, port: int, seconds: float, rate_mbit: float) -> dict[str, float]:
    per_slice = rate_mbit * 1e6 / 8 * SLICE_S
    payload = b"\0" * CHUNK
    sent = 0
    with socket.create_connection((to, port), timeout=10) as s:
        t0 = time.monotonic()
        while (now := time.monotonic()) - t0 < seconds:
            allowed = per_slice * ((now - t0) / SLICE_S + 1)
            if sent >= allowed:
                time.sleep(SLICE_S / 2)
                continue
            n = int(min(CHUNK, allowed - sent)) or 1
            s.sendall(payload[:n])
            sent += n
        s.shutdown(socket.SHUT_WR)
    return {"bytes": float(sent)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bwprobe")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--timeout", type=float, default=20.0)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, default=2.0)
    s.add_argument("--rate-mbit", type=float, default=400.0)
    a = p.parse_args(argv)
    try:
        if a.cmd == "recv":
            out = recv(a.bind, a.port, a.timeout)
        else:
            out = send(a.to, a.port, a.seconds, a.rate_mbit)
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
