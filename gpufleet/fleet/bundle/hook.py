"""`python -m gpufleet.fleet.bundle`: collect a sandbox node's bundle, for the node-health check's
before-drain hook, or a Kubernetes node's from the API server (`--kubeconfig`), for the Kubernetes
remediation's before-quarantine hook. It imports no CLI framework (the hook's start-up is part of
the delay it adds before the drain); `gpufleet bundle collect` is the same collection for people."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from gpufleet.fleet.bundle.caps import SANDBOX_CAPS
from gpufleet.fleet.bundle.service import (
    BundleInputError,
    collect_kubernetes,
    collect_sandbox,
    load_sandbox,
    make_caps,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpufleet.fleet.bundle", description=__doc__)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--state-file", type=Path, help="the sandbox's state.json")
    where.add_argument("--kubeconfig", type=Path, help="a Kubernetes node: the cluster's view, read with "
                       "this kubeconfig's identity")
    p.add_argument("--stack", default=None, help="--kubeconfig: the stack, written into the manifest")
    p.add_argument("--prometheus-url", default=None, help="--kubeconfig: the node's series from here")
    p.add_argument("--node", required=True)
    p.add_argument("--out", type=Path, required=True, help="folder the bundle is written to")
    p.add_argument("--trigger", default="node-health")
    p.add_argument("--reason", default=None, help="the fault (the drain reason)")
    p.add_argument("--detected-at", default=None, help="unix seconds the fault was detected")
    p.add_argument("--deadline", type=float, default=None, help="seconds for the whole collection")
    p.add_argument("--ship-to", type=Path, default=None,
                   help="an S3 location file (core.s3.S3Location, mode 0600): copy the bundle off the node "
                   "into that bucket, verified")
    return p


# Kept back from the node-health check's kill time to write the archive (a 20 KB bundle: milliseconds;
# the margin is for a loaded machine).
WRITE_MARGIN_S = 1.0
# Kept back as well when the bundle is shipped, for the upload and its read-back: the S3 client's
# connect timeout is 2 s (fleet.bundle.ship.client_for). Not measured as a duration.
SHIP_MARGIN_S = 2.0


def deadline_within(default_s: float, kill_at: str | None, now: float,
                    margin_s: float = WRITE_MARGIN_S) -> float:
    """The collection's deadline: the caps' default, shortened so the bundle is written (and shipped,
    with a larger `margin_s`) before the node-health check kills the hook
    (GPUFLEET_BEFORE_DRAIN_DEADLINE, unix seconds); never under 0.5 s."""
    if not kill_at:
        return default_s
    try:
        left = float(kill_at) - now - margin_s
    except ValueError:
        return default_s
    return max(0.5, min(default_s, left))


def run(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    args = build_parser().parse_args(argv)
    try:
        detected = float(args.detected_at) if args.detected_at else None
    except ValueError:
        err.write(f"--detected-at {args.detected_at!r}: not unix seconds\n")
        return 2
    target = None
    if args.ship_to is not None:
        # Imported only when shipping: boto3's import is part of the delay the hook adds before a drain.
        from gpufleet.fleet.bundle import ship as shipping

        try:
            target = shipping.read_target(args.ship_to)
        except shipping.ShipError as e:
            err.write(f"bundle: --ship-to {e}\n")
            return 2
    try:
        margin = WRITE_MARGIN_S + (SHIP_MARGIN_S if target is not None else 0.0)
        deadline = args.deadline if args.deadline is not None else deadline_within(
            SANDBOX_CAPS.deadline_s, os.environ.get("GPUFLEET_BEFORE_DRAIN_DEADLINE"), time.time(), margin)
        caps = make_caps(SANDBOX_CAPS, deadline_s=deadline)
        if args.kubeconfig is not None:
            path, manifest = collect_kubernetes(
                _kube_client(args.kubeconfig), args.node, args.out, caps, stack=args.stack,
                trigger=args.trigger, reason=args.reason or None, detected_at=detected,
                prometheus_url=args.prometheus_url)
        else:
            state = load_sandbox("", args.state_file)
            path, manifest = collect_sandbox(state, args.node, args.out, caps, trigger=args.trigger,
                                             reason=args.reason or None, detected_at=detected)
    except BundleInputError as e:
        err.write(f"bundle: {e}\n")
        return 2
    bad = [f"{m.collector}={m.status}" for m in manifest.members if m.status != "ok"]
    out.write(f"{path} ({manifest.total_bytes} bytes, {manifest.finished_at - manifest.started_at:.2f} s"
              + (f"; not ok: {', '.join(bad)}" if bad else "") + ")\n")
    if target is None:
        return 0
    shipped = shipping.ship(shipping.client_for(target), target, path, manifest)
    if not shipped["verified"]:
        # The bundle is on the node still; the node-health check logs this and drains all the same.
        err.write(f"bundle: not shipped to {shipped['url']}: {shipped['problem']}\n")
        return 1
    out.write(f"shipped to {shipped['url']} ({shipped['seconds']:.2f} s, sha256 verified)\n")
    return 0


def _kube_client(kubeconfig: Path) -> object:
    from gpufleet.core.kube_client import KubeClientError, kube_client

    try:
        return kube_client(kubeconfig)
    except KubeClientError as e:
        raise BundleInputError(f"--kubeconfig {kubeconfig}: {e}") from None
