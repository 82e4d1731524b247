"""`python -m gpufleet.fleet.bundle.nodepod`: what only a Kubernetes node holds, collected in a pod
on the node and carried off it through the pod's log (ADR 0085).

The pod runs the real-node table's commands (realnode.yaml: the vendor's tools, the fabric's, the
kernel log, the scheduler's and the agents' logs) where it runs, into one bundle as `gpufleet bundle
collect --real` would, and prints that archive to stdout between two marker lines, base64 in lines
of 76 characters (RFC 2045's line length). The collection outside reads the pod's log through the
API server and keeps the archive as one member of the node's Kubernetes bundle (`decode` checks its
length and sha256 against the header line).

The archive is capped at ARCHIVE_CAP_BYTES so that its base64 (4/3 of it) stays under the kubelet's
default containerLogMaxSize of 10 MiB (KubeletConfiguration reference), past which the kubelet
rotates the log and the start of the archive would be lost.

Exit 0: the archive was printed (its collectors may have failed; its manifest says which); 2: bad
input. The termination message is one JSON line: the archive's name, size and the collectors that
were not ok.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

BEGIN, END = "GPUFLEET-BUNDLE-BEGIN", "GPUFLEET-BUNDLE-END"
LINE = 76
MIB = 1024 * 1024
ARCHIVE_CAP_BYTES = 6 * MIB  # base64: 8 MiB, under the kubelet's 10 MiB log rotation


def encode(name: str, data: bytes) -> str:
    """The archive as the pod prints it (pure): a header naming it, its size and sha256, base64 lines,
    an end line."""
    text = base64.b64encode(data).decode()
    lines = [text[i:i + LINE] for i in range(0, len(text), LINE)]
    return "\n".join([f"{BEGIN} {name} {len(data)} {hashlib.sha256(data).hexdigest()}", *lines, END]) + "\n"


def decode(log: str) -> tuple[str, bytes]:
    """The last archive in a pod's log (pure), checked against its header; ValueError says why not."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(BEGIN + " ")]
    if not starts:
        raise ValueError(f"no {BEGIN} line in the pod's log")
    head = lines[starts[-1]].split()
    if len(head) != 4 or not head[2].isdigit():
        raise ValueError(f"bad header line {lines[starts[-1]][:120]!r}")
    name, size, digest = head[1], int(head[2]), head[3]
    body = []
    for line in lines[starts[-1] + 1:]:
        if line == END:
            break
        body.append(line.strip())
    else:
        raise ValueError(f"no {END} line after the archive's {len(body)} line(s): the log was cut short")
    try:
        data = base64.b64decode("".join(body), validate=True)
    except ValueError as e:
        raise ValueError(f"the archive is not base64: {e}") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"the archive is {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}; "
                         f"its header says {size} bytes, sha256 {digest[:12]}")
    if "/" in name or not name.endswith(".tar.gz"):
        raise ValueError(f"archive name {name!r}: not a bundle's file name")
    return name, data


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.fleet.bundle.nodepod", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default=os.environ.get("GPUFLEET_NODE", ""),
                   help="the node (default: $GPUFLEET_NODE, which the node pod sets)")
    p.add_argument("--vendor", default="nvidia")
    p.add_argument("--fabric", default="infiniband")
    p.add_argument("--scheduler", default="kubernetes")
    p.add_argument("--ifnames", default="", help="fabric interfaces, comma-separated")
    p.add_argument("--devices", default="", help="accelerator indexes, comma-separated")
    p.add_argument("--since-seconds", type=float, default=300.0, help="logs from this long ago")
    p.add_argument("--deadline", type=float, default=180.0, help="seconds for the whole collection")
    p.add_argument("--with", dest="with_", action="append", default=[], help="an off-by-default collector")
    p.add_argument("--reason", default=None)
    p.add_argument("--termination-log", type=Path, default=None)
    args = p.parse_args(argv)
    problems = []
    if not args.node:
        problems.append("--node: not given and $GPUFLEET_NODE is unset")
    if args.deadline <= 0 or args.since_seconds <= 0:
        problems.append("--deadline and --since-seconds must be positive")
    devices = [d for d in args.devices.split(",") if d]
    if not all(d.isdigit() for d in devices):
        problems.append(f"--devices {args.devices!r}: not accelerator indexes")
    if problems:
        print(f"nodepod: {'; '.join(problems)}", file=sys.stderr)
        return 2

    from gpufleet.fleet.bundle import realnode
    from gpufleet.fleet.bundle.caps import REAL_NODE_CAPS
    from gpufleet.fleet.bundle.service import BundleInputError, collect_real

    real = REAL_NODE_CAPS
    caps = real.model_copy(update={
        "deadline_s": args.deadline, "collector_timeout_s": min(real.collector_timeout_s, args.deadline),
        "total_bytes": ARCHIVE_CAP_BYTES, "collector_bytes": min(real.collector_bytes, ARCHIVE_CAP_BYTES)})
    now = time.time()
    facts = realnode.NodeFacts(node=args.node, vendor=args.vendor, fabric=args.fabric,
                               scheduler=args.scheduler, since=now - args.since_seconds, workdir=Path("."),
                               ifnames=tuple(i for i in args.ifnames.split(",") if i),
                               devices=tuple(int(d) for d in devices))
    with tempfile.TemporaryDirectory(prefix="gpufleet-nodepod-") as out:
        try:
            path, manifest = collect_real(facts, Path(out), caps, with_=tuple(args.with_), trigger="node-pod",
                                          reason=args.reason, detected_at=now)
        except BundleInputError as e:
            print(f"nodepod: {e}", file=sys.stderr)
            return 2
        data = path.read_bytes()
    sys.stdout.write(encode(path.name, data))
    sys.stdout.flush()
    not_ok = [f"{m.collector}={m.status}" for m in manifest.members if m.status != "ok"]
    summary = json.dumps({"bundle": path.name, "bytes": len(data), "notOk": not_ok})
    if args.termination_log is not None:
        with contextlib.suppress(OSError):  # the archive is in the log whatever happens here
            args.termination_log.write_text(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
