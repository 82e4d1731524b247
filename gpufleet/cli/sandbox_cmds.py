"""`gpufleet sandbox up|status|down|doctor`: the local sandbox cluster (docs/sandbox.md), and with
`--kubernetes` the Kubernetes sandbox: a real control plane on loopback with kwok nodes
(docs/kubernetes-sandbox.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import console, fail, input_errors
from gpufleet.cli.recorded_run_cmds import RunKind
from gpufleet.config.load import load_named_stack
from gpufleet.config.model import StackSpec
from gpufleet.sandbox.doctor import Check, diagnose, diagnose_kube
from gpufleet.sandbox.down import all_stacks, down
from gpufleet.sandbox.state import existing
from gpufleet.sandbox.status import status
from gpufleet.sandbox.up import SandboxError, UpOptions, require_root, up

sandbox_app = typer.Typer(
    help="The local sandbox cluster: namespaces, Slurm, Prometheus, training.", no_args_is_help=True
)

StackOpt = Annotated[str, typer.Option("--stack", "-s", help="stack name (stacks/Pulumi.<stack>.yaml)")]
StacksDirOpt = Annotated[Path, typer.Option("--stacks-dir", help="directory of the stack files")]
KubeOpt = Annotated[
    bool,
    typer.Option(
        "--kubernetes",
        help="the Kubernetes sandbox (kube-apiserver, etcd, controller manager, scheduler, kwok nodes) "
        "instead of the Slurm one; both can run at once",
    ),
]
StorageOpt = Annotated[
    bool,
    typer.Option(
        "--storage",
        help="the storage sandbox: a real Ceph cluster (mon, mgr, OSDs, radosgw) on loopback from the "
        "stack's storage.ceph (docs/storage.md); `down` without it removes the stack's storage too",
    ),
]
# Bounds of --nodes: gpufleet.sandbox.kube.nodes.MIN_NODES / MAX_NODES (not imported here: the
# CLI's import stays light; a unit test holds them equal).
MIN_KUBE_NODES = 1
MAX_KUBE_NODES = 5000
KUBE_RUN = RunKind("Kubernetes sandbox", "--kubernetes")
NodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        min=MIN_KUBE_NODES,
        max=MAX_KUBE_NODES,
        help="with --kubernetes: this many kwok nodes, spread over the stack's pools in their "
        "proportions (spares kept); default: the pools' own counts",
    ),
]


@sandbox_app.command("up")
@input_errors
def up_cmd(
    stack: StackOpt = "sandbox",
    stacks_dir: StacksDirOpt = Path("stacks"),
    rules: Annotated[
        list[Path] | None,
        typer.Option("--rules", help="Prometheus rule file(s); default: the repo's generated one"),
    ] = None,
    no_training: Annotated[
        bool, typer.Option("--no-training", help="do not submit the training job")
    ] = False,
    cluster_only: Annotated[
        bool,
        typer.Option(
            "--cluster-only",
            help="Kubernetes: control plane, CRDs and nodes only, none of the sandbox's platform "
            "stand-ins (chaos identity, remediation, Kueue, training): for `pulumi up` onto it",
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(help="seconds to wait for the sandbox to be ready (default 180; 600 with --kubernetes)"),
    ] = None,
    kubernetes: KubeOpt = False,
    nodes: NodesOpt = None,
    storage: StorageOpt = False,
    operator: Annotated[
        bool | None,
        typer.Option(
            "--gpu-operator/--no-gpu-operator",
            help="Kubernetes, NVIDIA stacks: run the GPU Operator for `gpufleet upgrade run --driver "
            "gpu-operator` (default: on up to 200 nodes; its first pass took 262 s at 1,250)",
        ),
    ] = None,
    kubelet_nodes: Annotated[
        int,
        typer.Option(
            "--kubelet-nodes",
            help="Kubernetes: the first pool's last N compute nodes are run by a real kubelet with "
            "containerd and runc instead of kwok, tainted gpufleet.io/kubelet-node (pods that "
            "tolerate it run real containers), 0-4",
        ),
    ] = 0,
) -> None:
    """Build the sandbox of a stack and wait until it is ready: Slurm nodes idle and training
    progressing, or with --kubernetes kwok nodes Ready and the training Job's pods Running."""
    if nodes is not None and not kubernetes:
        raise fail("--nodes sizes the Kubernetes sandbox: add --kubernetes", code=2)
    if operator is not None and (not kubernetes or cluster_only):
        raise fail("--gpu-operator is for the Kubernetes sandbox's platform: add --kubernetes, "
                   "without --cluster-only", code=2)
    if kubelet_nodes and not kubernetes:
        raise fail("--kubelet-nodes is for the Kubernetes sandbox: add --kubernetes", code=2)
    if cluster_only and not kubernetes:
        raise fail("--cluster-only is for the Kubernetes sandbox: add --kubernetes", code=2)
    spec = load_named_stack(stack, stacks_dir)
    if storage:
        from gpufleet.cli.storage_cmds import storage_up

        storage_up(stack, spec, 180.0 if timeout is None else timeout)
        return
    if kubernetes:
        if rules:
            raise fail("--rules is for the Slurm sandbox's Prometheus; the Kubernetes one has none", code=2)
        _kube_up(
            stack,
            spec,
            nodes,
            not (no_training or cluster_only),
            600.0 if timeout is None else timeout,
            platform=not cluster_only,
            gpu_operator=operator,
            kubelet_nodes=kubelet_nodes,
        )
        return
    timeout = 180.0 if timeout is None else timeout
    try:
        rec, timings = up(
            stack,
            spec,
            UpOptions(rule_files=rules, training=not no_training, timeout_s=timeout),
            say=lambda m: console.print(m, highlight=False),
        )
    except (SandboxError, TimeoutError, RuntimeError, OSError) as e:
        raise fail(f"{e}\n(state kept for cleanup: run `gpufleet sandbox down --stack {stack}`)") from None
    st = rec.state
    console.print(
        f"sandbox [bold]{stack}[/] up (run {st.run_id}) in {timings.marks.get('up', 0):.1f} s: "
        f"{len(st.nodes) - 1} nodes, Prometheus {st.prometheus_url}, state {rec.path}",
        highlight=False,
    )


def _kube_up(
    stack: str, spec: StackSpec, nodes: int | None, training: bool, timeout: float, platform: bool = True,
    gpu_operator: bool | None = None, kubelet_nodes: int = 0,
) -> None:
    from gpufleet.sandbox.kube.binaries import KubeBinariesMissing
    from gpufleet.sandbox.kube.cluster import KubeSandboxError, KubeUpOptions, kube_up

    try:
        rec, timings = kube_up(
            stack,
            spec,
            KubeUpOptions(nodes=nodes, training=training, timeout_s=timeout, platform=platform,
                          gpu_operator=gpu_operator, kubelet_nodes=kubelet_nodes),
            say=lambda m: console.print(m, highlight=False),
        )
    except KubeBinariesMissing as e:
        raise fail(str(e)) from None
    except (KubeSandboxError, TimeoutError, RuntimeError, OSError) as e:
        raise fail(
            f"{e}\n(state kept for cleanup: run `gpufleet sandbox down --kubernetes --stack {stack}`)"
        ) from None
    st = rec.state
    console.print(
        f"Kubernetes sandbox [bold]{stack}[/] up (run {st.run_id}) in {timings.marks.get('up', 0):.1f} s: "
        f"{len(st.nodes)} nodes ({len(st.spare_nodes)} spares), Kubernetes {st.kubernetes_version}",
        highlight=False,
    )
    console.print(f"  API server:        {st.api_url}", highlight=False)
    console.print(f"  CA:                {st.ca_file}", highlight=False)
    console.print(f"  admin kubeconfig:  {st.admin_kubeconfig}", highlight=False, soft_wrap=True)
    console.print(
        f"  chaos kubeconfig:  {st.chaos_kubeconfig}  (ServiceAccount "
        f"{st.chaos_namespace}/{st.chaos_service_account})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  state:             {rec.path}", highlight=False, soft_wrap=True)
    console.print(
        f"  try: KUBECONFIG={st.admin_kubeconfig} kubectl get nodes", highlight=False, soft_wrap=True
    )


def _kube_status(stack: str, as_json: bool) -> None:
    from gpufleet.cli.recorded_run_cmds import print_header, print_processes, require_run
    from gpufleet.sandbox.kube.cluster import existing_kube, kube_status

    info = kube_status(require_run(KUBE_RUN, stack, existing_kube))
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print_header(KUBE_RUN, info)
    console.print(f"  API server: {info['api_url']}  base: {info['base_dir']}", highlight=False)
    print_processes(info)
    if info["error"]:
        console.print(f"  [red]{info['error']}[/]", highlight=False)
    if info["nodes"] is not None:
        n = info["nodes"]
        console.print(
            f"  nodes: {n['total']} ({n['ready']} Ready, {n['cordoned']} cordoned, {n['spares']} spares)",
            highlight=False,
        )
    if info["pods"] is not None:
        p = dict(info["pods"])
        total = p.pop("total")
        phases = ", ".join(f"{v} {k}" for k, v in sorted(p.items()))
        console.print(f"  pods: {total}" + (f" ({phases})" if phases else ""), highlight=False)


@sandbox_app.command("status")
def status_cmd(
    stack: StackOpt = "sandbox",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    kubernetes: KubeOpt = False,
    storage: StorageOpt = False,
) -> None:
    """Show a sandbox: phase, processes, Slurm node states, training progress (with --kubernetes:
    daemons, node and pod counts)."""
    if storage:
        from gpufleet.cli.storage_cmds import storage_status

        storage_status(stack, as_json)
        return
    if kubernetes:
        _kube_status(stack, as_json)
        return
    found = existing(stack)
    if found.error:
        raise fail(f"unreadable state file {found.error}")
    if found.state is None:
        raise fail(f"no sandbox for stack {stack!r}; start one with `gpufleet sandbox up --stack {stack}`")
    info = status(found.state)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"sandbox {info['stack']} run {info['run_id']}: phase {info['phase']}", highlight=False)
    console.print(f"  prometheus: {info['prometheus_url']}  base: {info['base_dir']}", highlight=False)
    dead = [n for n, ok in info["processes"].items() if not ok]
    console.print(
        f"  processes: {len(info['processes']) - len(dead)} running"
        + (f", NOT running: {', '.join(dead)}" if dead else ""),
        highlight=False,
    )
    for name, node in sorted(info["slurm_nodes"].items()):
        reason = f" ({node['reason']})" if node["reason"] else ""
        console.print(
            f"  {name}: {node['state']}{'' if node['responding'] else ' (not responding)'}{reason}",
            highlight=False,
        )
    if info["training"] is not None:
        t = info["training"]
        console.print(f"  training: step {t['max_step']}, restarts {t['restarts']}", highlight=False)


@sandbox_app.command("down")
def down_cmd(
    stack: StackOpt = "sandbox",
    all_: Annotated[bool, typer.Option("--all", help="every sandbox with a state file")] = False,
    keep_files: Annotated[bool, typer.Option("--keep-files", help="keep the run directory (logs)")] = False,
    kubernetes: KubeOpt = False,
    storage: StorageOpt = False,
    leftovers: Annotated[bool, typer.Option(
        "--leftovers", help="instead: remove the namespaces and links of killed runs that no state file "
                            "under the state root records and no process runs in (`sandbox doctor` lists "
                            "them)")] = False,
) -> None:
    """Remove exactly what `up` made (also after a crashed `up`). Idempotent. With --kubernetes,
    the Kubernetes sandbox's run only (the Slurm sandbox of the stack is left alone)."""
    if kubernetes:
        _kube_down(stack, all_, keep_files)
        return
    try:
        require_root()
    except SandboxError as e:
        raise fail(str(e)) from None
    if leftovers:
        _down_leftovers()
        return
    from gpufleet.cli.storage_cmds import storage_down

    if storage:
        if not storage_down(stack, all_, keep_files):
            raise typer.Exit(1)
        return
    stacks = all_stacks() if all_ else [stack]
    bad = False
    for s in stacks:
        try:
            report = down(s, keep_files=keep_files)
        except RuntimeError as e:
            raise fail(str(e)) from None
        if report is None:
            console.print(f"no sandbox for stack {s!r}: nothing to do", highlight=False)
        elif report.clean:
            console.print(
                f"sandbox {s} (run {report.run_id}) removed; {report.stopped} processes stopped",
                highlight=False,
            )
        else:
            bad = True
            console.print(
                f"[red]sandbox {s} (run {report.run_id}) NOT fully removed[/]: "
                f"processes {report.left_processes}, network {report.network_errors}, "
                f"mounts {report.unmount_errors}; state kept, run `down` again",
                highlight=False,
            )
    # The stack's storage sandbox belongs to it too (a separate state file, so it is quiet when absent).
    if not storage_down(stack, all_, keep_files, quiet_if_none=True):
        bad = True
    if bad:
        raise typer.Exit(1)


def _kube_down(stack: str, all_: bool, keep_files: bool) -> None:
    from gpufleet.cli.recorded_run_cmds import take_down
    from gpufleet.sandbox.kube.cluster import KubeSandboxError, all_kube_stacks, kube_down

    stacks = all_kube_stacks() if all_ else [stack]
    if not take_down(KUBE_RUN, stacks, lambda s: kube_down(s, keep_files=keep_files), KubeSandboxError):
        raise typer.Exit(1)


def _down_leftovers() -> None:
    from gpufleet.sandbox.leftovers import remove, survey

    found = survey()
    if not found.leftovers:
        console.print("no leftover runs: every gf-* namespace and link is a recorded or a live run's",
                      highlight=False)
    problems = []
    for run in found.leftovers:
        errors = remove(run)
        problems += errors
        if not errors:
            console.print(f"run {run.run_id}: removed {len(run.namespaces)} namespace(s), "
                          f"{len(run.links)} link(s)", highlight=False)
    for run, n in found.live:
        console.print(f"run {run.run_id}: {n} process(es) run in its namespaces; another state root's "
                      "sandbox, not touched", highlight=False)
    if problems:
        for p in problems:
            console.print(f"[red]{p}[/]", highlight=False)
        raise typer.Exit(1)


def leftover_checks() -> list[Check]:
    """`sandbox doctor`'s view of killed runs (gpufleet.sandbox.leftovers): each leftover fails, with
    the command that removes it; a live run of another state root is said, and passes."""
    from gpufleet.sandbox.leftovers import survey

    found = survey()
    checks = [Check(f"leftover run {r.run_id}", False,
                    f"{len(r.namespaces)} namespace(s), {len(r.links)} link(s): no state file under this "
                    "state root records it and no process runs in it", "gpufleet sandbox down --leftovers")
              for r in found.leftovers]
    checks += [Check(f"live run {r.run_id}", True, f"{n} process(es) in {len(r.namespaces)} namespace(s): a "
                     "sandbox of another state root (GPUFLEET_SANDBOX_ROOT)") for r, n in found.live]
    return checks or [Check("leftover runs", True, "none: every gf-* namespace and link is a recorded run's")]


@sandbox_app.command("doctor")
def doctor_cmd(kubernetes: KubeOpt = False, storage: StorageOpt = False) -> None:
    """Check this machine for everything the sandbox needs; say how to get what is missing. With
    --kubernetes: the programs built by `make kube-bins` and the Python packages it uses; with
    --storage: the Ceph packages (Debian 12's Ceph 16)."""
    if storage:
        from gpufleet.cli.storage_cmds import storage_doctor

        storage_doctor()
        return
    checks: list[Check] = diagnose_kube() if kubernetes else diagnose()
    if not kubernetes and os.geteuid() == 0:  # listing namespaces' processes needs root
        checks += leftover_checks()
    for c in checks:
        mark = "[green]ok[/]     " if c.ok else "[red]MISSING[/]"
        console.print(f"{mark} {c.name}: {c.detail}", highlight=False)
        if c.fix:
            console.print(f"        fix: {c.fix}", highlight=False, soft_wrap=True)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `gpufleet sandbox ...` to the app."""
    app.add_typer(sandbox_app, name="sandbox")
