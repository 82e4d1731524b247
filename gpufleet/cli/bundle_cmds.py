"""CLI of diagnostic bundles: `gpufleet bundle collect` (a sandbox node, this real node from the
vendor table, or a Kubernetes node from the API server) and `gpufleet bundle show FILE` (the
manifest, every member's hash checked).

Exit codes: collect 0 when the bundle is written (a collector that failed is in its manifest), 2 on
bad input; show 0 when every hash matches, 1 when the archive disagrees with its manifest, 2 when the
file is not a bundle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.common import cluster_client, console, fail, input_errors, print_json

if TYPE_CHECKING:
    from gpufleet.fleet.node_pod import NodePod

DEFAULT_OUT = Path(".gpufleet/bundles")


def register(app: typer.Typer) -> None:
    bundle = typer.Typer(name="bundle", no_args_is_help=True,
                         help="Diagnostic bundles: one archive of what a vendor asks for, with a manifest.")
    app.add_typer(bundle)

    @bundle.command("collect")
    @input_errors
    def collect(
        node: Annotated[str, typer.Option(help="the node to collect")],
        stack: Annotated[str, typer.Option("--stack", "-s", help="stack whose running sandbox holds the node")
                         ] = "sandbox",
        out: Annotated[Path, typer.Option(help="folder the bundle is written to")] = DEFAULT_OUT,
        since: Annotated[str | None, typer.Option(help="logs and metrics from: 10m, 2h, unix seconds or "
                                                  "ISO 8601 with zone (default: 5 minutes before)")] = None,
        reason: Annotated[str | None, typer.Option(help="the fault, written into the manifest")] = None,
        real: Annotated[bool, typer.Option(help="this machine is the node: run the vendor table's commands "
                                           "(realnode.yaml) here instead of reading a sandbox")] = False,
        kubernetes: Annotated[bool, typer.Option(help="the node is a Kubernetes node: collect the cluster's "
                                                 "view of it (Node, its events, its pods, its inspect "
                                                 "reading) from the API server")] = False,
        kubeconfig: Annotated[Path | None, typer.Option(
            help="--kubernetes: the cluster (default: the stack's Kubernetes sandbox, else $KUBECONFIG)")
                              ] = None,
        prometheus_url: Annotated[str | None, typer.Option(help="--kubernetes: also the node's series "
                                                           "from this Prometheus")] = None,
        node_pod: Annotated[bool, typer.Option(
            "--node-pod", help="--kubernetes: also what only the node holds, collected by the stack's "
                               "bundle.nodePod on it (on the Kubernetes sandbox, gpufleet's own on a "
                               "kubelet node)")] = False,
        vendor: Annotated[str, typer.Option(help="--real: nvidia, amd or ascend")] = "nvidia",
        fabric: Annotated[str, typer.Option(help="--real: infiniband, roce or efa")] = "infiniband",
        scheduler: Annotated[str, typer.Option(help="--real: slurm, kubernetes, volcano or kueue")] = "slurm",
        ifnames: Annotated[str, typer.Option(help="--real: fabric interfaces, comma-separated")] = "",
        devices: Annotated[str, typer.Option(help="--real: accelerator indexes, comma-separated")] = "",
        with_: Annotated[list[str] | None, typer.Option(
            "--with", help="--real: also run this collector that is off by default (e.g. ibdiagnet)")] = None,
        timeout: Annotated[float | None, typer.Option(help="seconds per collector")] = None,
        collector_mib: Annotated[float | None, typer.Option(help="output cap per collector, MiB")] = None,
        total_mib: Annotated[float | None, typer.Option(help="cap on the whole bundle, MiB")] = None,
        deadline: Annotated[float | None, typer.Option(help="seconds for the whole collection")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="print the manifest as JSON")] = False,
    ) -> None:
        """Collect one node's diagnostic bundle (tar.gz + manifest.json) into --out."""
        from gpufleet.fleet.bundle import realnode
        from gpufleet.fleet.bundle.caps import REAL_NODE_CAPS, SANDBOX_CAPS
        from gpufleet.fleet.bundle.service import (
            BundleInputError,
            collect_kubernetes,
            collect_real,
            collect_sandbox,
            load_sandbox,
            make_caps,
            parse_since,
        )

        if real and kubernetes:
            raise fail("--real and --kubernetes: give one (this machine, or the cluster's view of a node)", 2)
        if node_pod and not kubernetes:
            raise fail("--node-pod needs --kubernetes (the pod runs on a Kubernetes node)", 2)
        pod = _bundle_pod(stack, kubeconfig, node) if node_pod else None

        now = time.time()
        try:
            start = parse_since(since, now) if since is not None else None
            caps = make_caps(REAL_NODE_CAPS if real else SANDBOX_CAPS, timeout, collector_mib, total_mib,
                             deadline)
            if real:
                facts = realnode.NodeFacts(
                    node=node, vendor=vendor, fabric=fabric, scheduler=scheduler,
                    since=start if start is not None else now - 300, workdir=Path("."),
                    ifnames=tuple(i for i in ifnames.split(",") if i),
                    devices=_ints(devices))
                path, manifest = collect_real(facts, out, caps, with_=tuple(with_ or ()), stack=None)
            elif kubernetes:
                path, manifest = collect_kubernetes(
                    cluster_client(stack, kubeconfig, sandbox_default=True), node, out, caps, stack=stack,
                    reason=reason, since=start, prometheus_url=prometheus_url, node_pod=pod)
            else:
                state = load_sandbox(stack)
                path, manifest = collect_sandbox(state, node, out, caps, since=start)
        except BundleInputError as e:
            raise fail(str(e), 2) from None
        if json_out:
            print_json({"path": str(path), "manifest": manifest.model_dump(mode="json")})
            return
        console.print(f"wrote {path}", highlight=False)
        _print_members(manifest)

    @bundle.command("show")
    def show(
        file: Annotated[Path, typer.Argument(help="a bundle (.tar.gz)")],
        json_out: Annotated[bool, typer.Option("--json", help="print the manifest and problems as JSON")
                            ] = False,
    ) -> None:
        """Print a bundle's manifest and check every member's size and sha256 against it."""
        from gpufleet.fleet.bundle.archive import BundleError, verify

        try:
            manifest, problems = verify(file)
        except BundleError as e:
            raise fail(str(e), 2) from None
        if json_out:
            print_json({"manifest": manifest.model_dump(mode="json"), "problems": problems,
                        "verified": not problems})
        else:
            console.print(f"{file}: node {manifest.node} ({manifest.source}), trigger {manifest.trigger}"
                          + (f", reason: {manifest.reason}" if manifest.reason else ""), highlight=False,
                          markup=False)
            _print_members(manifest)
            for p in problems:
                console.print(f"  MISMATCH {p}", highlight=False, markup=False)
            console.print("verified: every member matches its sha256" if not problems
                          else f"{len(problems)} problem(s)", highlight=False)
        raise typer.Exit(1 if problems else 0)


def _bundle_pod(stack: str, kubeconfig: Path | None, node: str) -> NodePod:
    """The stack's `bundle.nodePod`; on the stack's Kubernetes sandbox without one, gpufleet's own
    on a kubelet node (a kwok node runs no container). Exit 2 when there is none."""
    from gpufleet.cli import node_pods
    from gpufleet.config import load_named_stack
    from gpufleet.core.sandbox_contract import read_kube_state

    spec = load_named_stack(stack)
    pod = node_pods.bundle_pod(spec)
    if pod is not None:
        return pod
    kubelet: list[str] | None = None
    if kubeconfig is None:
        try:
            kubelet = read_kube_state(stack).kubelet_nodes
        except (OSError, ValueError):
            kubelet = None
    if kubelet is None:
        raise fail(f"--node-pod: stack {stack} sets no bundle.nodePod (docs/diagnostic-bundles.md)", 2)
    if node not in kubelet:
        raise fail(f"--node-pod: {node} is a kwok node of the Kubernetes sandbox and runs no container; "
                   f"its kubelet nodes: {', '.join(kubelet) or 'none (sandbox up --kubelet-nodes N)'}", 2)
    return node_pods.sandbox_bundle_pod(spec)


def _ints(text: str) -> tuple[int, ...]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            raise fail(f"--devices {text!r}: {part!r} is not an accelerator index", 2)
        out.append(int(part))
    return tuple(out)


def _print_members(manifest: object) -> None:
    from rich.table import Table

    from gpufleet.fleet.bundle.model import Manifest

    assert isinstance(manifest, Manifest)
    t = Table("collector", "member", "status", "exit", "bytes", "s", "truncated", "error")
    for m in manifest.members:
        t.add_row(m.collector, m.name or "-", m.status, "-" if m.exit_status is None else str(m.exit_status),
                  str(m.size), f"{m.duration_s:.2f}", "yes" if m.truncated else "", m.error or "")
    console.print(t)
    console.print(f"{manifest.total_bytes} bytes kept (cap {manifest.caps.total_bytes}); collected in "
                  f"{manifest.finished_at - manifest.started_at:.2f} s", highlight=False)
