"""The three ways to collect a bundle (a sandbox node, a real node, a Kubernetes node from the API
server), shared by `gpufleet bundle collect` and the light entry point the node-health check's and
the Kubernetes remediation's hooks run (`python -m gpufleet.fleet.bundle`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from gpufleet.core.sandbox_contract import SandboxState, read_state, state_path
from gpufleet.fleet.bundle import realnode
from gpufleet.fleet.bundle import sandbox as SB
from gpufleet.fleet.bundle.collect import Request, collect
from gpufleet.fleet.bundle.model import Caps, Manifest
from gpufleet.fleet.bundle.runner import Collector
from gpufleet.fleet.node_pod import START_MARGIN_S, NodePod


class BundleInputError(ValueError):
    """Bad input to a collection (no sandbox, unknown node, bad --since...): exit 2."""


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float) -> float:
    """`--since`: a duration back from now (`90s`, `10m`, `2h`, `1d`), unix seconds, or an ISO 8601
    time with its zone (`2026-12-05T05:00:00Z`)."""
    t = text.strip()
    m = _DURATION.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        value = float(t)
    except ValueError:
        pass
    else:
        if value <= 0:
            raise BundleInputError(f"--since {text!r}: unix seconds must be positive")
        return value
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise BundleInputError(f"--since {text!r}: not a duration (90s, 10m, 2h, 1d), unix seconds or an "
                               "ISO 8601 time") from None
    if dt.tzinfo is None:
        raise BundleInputError(f"--since {text!r}: give the time zone (e.g. a trailing Z for UTC)")
    return dt.timestamp()


def check_caps(caps: Caps) -> Caps:
    if caps.collector_bytes > caps.total_bytes:
        raise BundleInputError(f"per-collector cap {caps.collector_bytes} bytes is over the total cap "
                               f"{caps.total_bytes}")
    return caps


def make_caps(base: Caps, timeout_s: float | None = None, collector_mib: float | None = None,
              total_mib: float | None = None, deadline_s: float | None = None) -> Caps:
    """The defaults with what the user gave; a configured value is never replaced by a default."""
    update: dict[str, float | int] = {}
    if timeout_s is not None:
        update["collector_timeout_s"] = timeout_s
    if collector_mib is not None:
        update["collector_bytes"] = int(collector_mib * 1024 * 1024)
    if total_mib is not None:
        update["total_bytes"] = int(total_mib * 1024 * 1024)
    if deadline_s is not None:
        update["deadline_s"] = deadline_s
    try:
        caps = Caps.model_validate({**base.model_dump(), **update})
    except ValidationError as e:
        err = e.errors()[0]
        raise BundleInputError(f"caps: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return check_caps(caps)


def load_sandbox(stack: str, state_file: Path | None = None) -> SandboxState:
    """The running sandbox's state: the stack's under the state root, or the file given (the hook
    passes it: slurmd's environment does not carry GPUFLEET_SANDBOX_ROOT)."""
    root = None
    if state_file is not None:
        stack, root = state_file.parent.name, state_file.parent.parent
    path = state_path(stack, root)
    try:
        return read_state(stack, root)
    except FileNotFoundError:
        raise BundleInputError(f"{path}: no sandbox state file (is `gpufleet sandbox up --stack {stack}` "
                               "running?)") from None
    except (OSError, ValueError) as e:
        raise BundleInputError(f"{path}: {e}") from None


def collect_sandbox(state: SandboxState, node: str, out_dir: Path, caps: Caps, *, trigger: str = "manual",
                    reason: str | None = None, detected_at: float | None = None,
                    since: float | None = None) -> tuple[Path, Manifest]:
    if node not in {n.name for n in state.nodes}:
        raise BundleInputError(f"no node {node!r} in sandbox {state.stack}; nodes: "
                               f"{', '.join(n.name for n in state.nodes)}")
    start, end = _window(detected_at, since)
    req = Request(node=node, stack=state.stack, source="sandbox", trigger=trigger, reason=reason,
                  detected_at=detected_at, window=(start, end))
    return collect(req, SB.collectors(state, node, start, end), check_caps(caps), out_dir)


def _window(detected_at: float | None, since: float | None) -> tuple[float, float]:
    """The metrics and log window around the detection (now when not given), or bad input."""
    now = time.time()
    try:
        return SB.window(detected_at if detected_at is not None else now, now, since)
    except ValueError as e:
        raise BundleInputError(f"--since: {e}") from None


def collect_kubernetes(api_client: object, node: str, out_dir: Path, caps: Caps, *, stack: str | None = None,
                       trigger: str = "manual", reason: str | None = None, detected_at: float | None = None,
                       since: float | None = None, prometheus_url: str | None = None,
                       node_pod: NodePod | None = None) -> tuple[Path, Manifest]:
    """The cluster's view of a Kubernetes node (fleet.bundle.kube), read with `api_client`; with
    `node_pod`, also what the node itself holds, collected by that pod (the bundle's deadline then
    covers the pod's)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpufleet.fleet.bundle import kube as KB

    try:
        resp = client.CoreV1Api(api_client).read_node(node, _request_timeout=caps.collector_timeout_s,
                                                      _preload_content=False)
        node_doc = json.loads(resp.data)
    except ApiException as e:
        raise BundleInputError(f"node {node}: HTTP {e.status} {e.reason}"
                               + (" (no such node in the cluster)" if e.status == 404 else "")) from None
    except (HTTPError, OSError, ValueError) as e:
        raise BundleInputError(f"cannot reach the cluster's API server: {e}") from None
    start, end = _window(detected_at, since)
    req = Request(node=node, stack=stack, source="kubernetes", trigger=trigger, reason=reason,
                  detected_at=detected_at, window=(start, end))
    collectors = KB.collectors(api_client, node, start, end, prometheus_url, node_doc=node_doc,
                               node_pod=node_pod, run_id=uuid.uuid4().hex[:8])
    if node_pod is not None:
        caps = caps.model_copy(update={"deadline_s": max(caps.deadline_s,
                                                         node_pod.deadline_s + START_MARGIN_S + 5.0)})
    return collect(req, collectors, check_caps(caps), out_dir)


def collect_real(facts: realnode.NodeFacts, out_dir: Path, caps: Caps, *, with_: tuple[str, ...] = (),
                 trigger: str = "manual", reason: str | None = None, detected_at: float | None = None,
                 stack: str | None = None) -> tuple[Path, Manifest]:
    """Run the table's commands for this node, here (the node itself: the node-health hook runs where
    the vendor tools are). Scratch files go to a private folder removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bundle-"))
    try:
        facts = dataclasses.replace(facts, workdir=workdir)
        try:
            planned = realnode.plan(realnode.load_table(), facts, with_)
        except ValueError as e:
            raise BundleInputError(str(e)) from None
        collectors = [Collector(p.name, p.member, p.argv, produces=p.produces) for p in planned]
        req = Request(node=facts.node, stack=stack, source=facts.vendor, trigger=trigger, reason=reason,
                      detected_at=detected_at, window=(facts.since, time.time()))
        return collect(req, collectors, check_caps(caps), out_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bundles_for_failing_nodes(collect_node: Callable[[str, str, Path], tuple[Path, Manifest]],
                              failing: dict[str, str], report_dir: Path) -> dict[str, dict[str, object]]:
    """One bundle per failing node (node -> the failure that names it), under <report_dir>/bundles, by
    `collect_node(node, reason, folder)` (a sandbox's or a cluster's collection); the report's entry
    per node: the path relative to the report, size, and collectors not ok."""
    out: dict[str, dict[str, object]] = {}
    for node, reason in sorted(failing.items()):
        path, manifest = collect_node(node, reason, report_dir / "bundles")
        out[node] = {"path": str(path.relative_to(report_dir)), "bytes": path.stat().st_size,
                     "not_ok": [f"{m.collector}: {m.status}" for m in manifest.members if m.status != "ok"]}
    return out
