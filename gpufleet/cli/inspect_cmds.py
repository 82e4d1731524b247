"""CLI of fleet inspection: `gpufleet inspect --stack S --level light|full [--out DIR]`.

Reads the stack's running sandbox (its node agents, Slurm's node states, a TCP bandwidth probe on a
full sweep), checks every GPU node, appends the results to the stack's history, and writes one
HTML + JSON + JUnit report with trends, deltas and the lemon list. `--node N --format npd` prints
one node's verdict in node-problem-detector's custom-plugin form and exits with its code.
`--here` reads the host it runs on instead (`--publish`: and writes what it read to the cluster);
`--kubernetes` sweeps a cluster whose nodes publish (gpufleet.fleet.inspect.cluster); with `--level
full` it also runs the stack's performance pod (`inspect.perfPod`, ADR 0083) on the nodes inspect's
plan lets the heavy checks run on (idle or drained), one at a time. `--slurm` sweeps a Slurm cluster
whose nodes publish to a shared folder (`--here --publish-dir`, gpufleet.fleet.inspect.slurm_cluster,
ADR 0088); with `--level full` it runs the stack's performance job (`inspect.perfJob`) through srun.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.common import cluster_client, console, fail, input_errors, print_json

if TYPE_CHECKING:
    from gpufleet.config import StackSpec
    from gpufleet.config.model import PerfJob
    from gpufleet.fleet.bundle.model import Manifest
    from gpufleet.fleet.inspect.observation import NodeObservation
    from gpufleet.fleet.node_pod import NodePod


class Level(StrEnum):
    LIGHT = "light"
    FULL = "full"


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    NPD = "npd"


DEFAULT_HISTORY = Path(".gpufleet/inspect/history")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("inspect")
    @input_errors
    def inspect(
        stack: Annotated[str, typer.Option("--stack", "-s", help="stack whose running sandbox to inspect")
                         ] = "sandbox",
        level: Annotated[Level, typer.Option(
            help="light: state checks on every node; full: also the performance probe, on idle or "
            "drained nodes only")] = Level.LIGHT,
        out: Annotated[Path | None, typer.Option(help="write inspect.html/.json/.junit.xml here")] = None,
        history_dir: Annotated[Path, typer.Option("--history", help="folder of per-stack history files")
                               ] = DEFAULT_HISTORY,
        floor: Annotated[float | None, typer.Option(help="performance floor, % of the reference "
                                                    "(default: thresholds.yaml, 90)")] = None,
        node: Annotated[str | None, typer.Option(help="report this node only (with --format npd)")] = None,
        fmt: Annotated[Format, typer.Option("--format", help="table, json, or npd (one node)")
                       ] = Format.TABLE,
        stacks_dir: Annotated[Path, typer.Option(help="where the stack files are")] = Path("stacks"),
        record: Annotated[bool, typer.Option(help="append the results to the history")] = True,
        bundle: Annotated[bool, typer.Option(
            help="with --out: collect a diagnostic bundle of every failing node into <out>/bundles and link "
            "it from the report (docs/diagnostic-bundles.md)")] = False,
        here: Annotated[bool, typer.Option(
            "--here", help="inspect the host this runs on (a real GPU node: nvidia-smi, the kernel log, "
            "sysfs ports), as a HealthCheckProgram or node-problem-detector plugin; light checks only")
                        ] = False,
        pool_name: Annotated[str | None, typer.Option(
            "--pool", help="with --here: the stack's node pool this host belongs to (default: its GPU pool)")
                             ] = None,
        fabric_if: Annotated[list[str] | None, typer.Option(
            "--fabric-if", help="with --here: read these Ethernet interfaces as the fabric ports instead of "
            "the HCA ports (repeatable)")] = None,
        kernel_log: Annotated[Path | None, typer.Option(
            help="with --here: read XIDs from this log file instead of `dmesg`")] = None,
        publish: Annotated[bool, typer.Option(
            help="with --here: write what was read to the cluster (a ConfigMap per node, read by "
            "--kubernetes)")] = False,
        kubernetes: Annotated[bool, typer.Option(
            "--kubernetes", help="sweep a Kubernetes cluster whose nodes publish (--here --publish): "
            "the stack's Kubernetes sandbox, or --kubeconfig")] = False,
        kubeconfig: Annotated[Path | None, typer.Option(
            help="with --publish or --kubernetes: the cluster's kubeconfig (default: the stack's "
            "Kubernetes sandbox for --kubernetes, else $KUBECONFIG, ~/.kube/config or in-cluster)")] = None,
        namespace: Annotated[str | None, typer.Option(
            help="with --publish or --kubernetes: where the nodes' results live (default gpufleet-inspect)")
                             ] = None,
        max_age: Annotated[float | None, typer.Option(
            help="with --kubernetes or --slurm: a node's result older than this many seconds is UNKNOWN "
            "(default 900: three missed runs of a 5-minute publishing)")
                           ] = None,
        slurm: Annotated[bool, typer.Option(
            "--slurm", help="sweep the Slurm cluster whose client commands run here (sinfo, scontrol), "
            "its nodes publishing to --publish-dir (`--here --publish-dir`)")] = False,
        publish_dir: Annotated[Path | None, typer.Option(
            help="with --here: also write what was read to <dir>/inspect-<node>.json; with --slurm: read "
            "the nodes' files there (a folder of the cluster's shared file system)")] = None,
    ) -> None:
        """Inspect every GPU node of the stack's sandbox, with --here this host, or with --kubernetes
        every node of a cluster: GPU count, XIDs, ECC, PCIe, fabric ports and flaps, driver/firmware
        drift, performance vs the pool's reference; trends and lemons. With --slurm, every node of a
        Slurm cluster whose nodes publish to --publish-dir. Exit 0: no node fails; 1: a node fails; 2:
        bad input or no sandbox (with --format npd or --here: the node's code, 2 when a source could
        not be read)."""
        from gpufleet.catalog import load_catalog, xid_policy
        from gpufleet.config.load import load_named_stack
        from gpufleet.core.agent_client import AgentError
        from gpufleet.core.errors import InputError, Problem
        from gpufleet.core.sandbox_contract import read_state
        from gpufleet.fleet.inspect import history as H
        from gpufleet.fleet.inspect import sandbox as SB
        from gpufleet.fleet.inspect.checks import Pins
        from gpufleet.fleet.inspect.contracts import exit_code, npd_message
        from gpufleet.fleet.inspect.host import HostTarget, observation_from_host, read_host
        from gpufleet.fleet.inspect.plan import plan_sweep
        from gpufleet.fleet.inspect.report import to_doc, write_reports
        from gpufleet.fleet.inspect.sweep import run_sweep
        from gpufleet.fleet.inspect.thresholds import load_thresholds

        if bundle and out is None:
            raise fail("--bundle writes into the report folder: give --out", 2)
        if here and (level is Level.FULL or bundle):
            raise fail("--here runs the light checks of this host: the full level's probes pair nodes, and "
                       "--bundle collects from the sandbox", 2)
        if not here and (pool_name or fabric_if or kernel_log or publish):
            raise fail("--pool, --fabric-if, --kernel-log and --publish read this host: give --here", 2)
        if kubernetes and here:
            raise fail("--kubernetes sweeps what the cluster's nodes publish: not with --here", 2)
        if slurm and (here or kubernetes):
            raise fail("--slurm sweeps what a Slurm cluster's nodes publish: not with --here or "
                       "--kubernetes", 2)
        if slurm and publish_dir is None:
            raise fail("--slurm reads the files the nodes write (`inspect --here --publish-dir`): give "
                       "--publish-dir", 2)
        if publish_dir is not None and not (here or slurm):
            raise fail("--publish-dir is where --here writes and --slurm reads: give one of them", 2)
        if slurm and bundle:
            raise fail("--bundle collects from the sandbox or the Kubernetes API; on a Slurm cluster collect "
                       "on the node (`gpufleet bundle collect --real`)", 2)
        if publish_dir is not None:
            _check_publish_dir(publish_dir, write=here)
        if not (publish or kubernetes) and (kubeconfig is not None or namespace is not None):
            raise fail("--kubeconfig and --namespace name the cluster of --publish or --kubernetes", 2)
        if max_age is not None and (not (kubernetes or slurm) or max_age <= 0):
            raise fail(f"--max-age {max_age}: a number of seconds > 0, with --kubernetes or --slurm", 2)
        if kubeconfig is not None and not kubeconfig.is_file():
            raise fail(f"--kubeconfig {kubeconfig}: not a file", 2)
        if fmt is Format.NPD and node is None and not here:
            raise fail("--format npd reports one node: give --node", 2)
        if floor is not None and not 0 < floor <= 100:
            raise fail(f"--floor {floor}: a percentage in (0, 100]", 2)
        spec = load_named_stack(stack, stacks_dir)
        catalog = load_catalog()
        rules, problems = xid_policy(catalog, spec.remediation.xid_overrides)
        if problems:
            raise InputError(f"stack {stack}", problems)
        thresholds = load_thresholds()
        serving = spec.sandbox.serving.pool if spec.sandbox is not None and spec.sandbox.serving else None
        pool = next(p for p in spec.node_pools if p.name != serving)
        if pool_name is not None:
            named = [p for p in spec.node_pools if p.name == pool_name]
            if not named:
                pools = ", ".join(p.name for p in spec.node_pools)
                raise InputError(f"stack {stack}", [Problem("--pool", f"no node pool {pool_name!r} "
                                                                  f"(pools: {pools})")])
            pool = named[0]
        if kernel_log is not None and not kernel_log.is_file():
            raise InputError("--kernel-log", [Problem(str(kernel_log), "not a file")])
        if slurm and level is Level.FULL and spec.inspect.perf_job is None:
            raise fail("--level full on Slurm measures the idle nodes with the stack's performance job: "
                       f"stack {stack} sets no inspect.perfJob (docs/fleet-inspect.md)", 2)
        state = None
        if not here and not kubernetes and not slurm:
            try:
                state = read_state(stack)
            except (OSError, ValueError) as e:
                raise fail(f"no running sandbox for stack {stack}: {e} (start one with "
                           "`gpufleet sandbox up`)", 2) from None
        path = H.history_path(history_dir, stack)
        try:
            past = H.load(path) if path.exists() else []
        except ValueError as e:
            raise fail(str(e), 2) from None
        since = {n: o.at for n, o in H.last_observations(past).items()}
        t0 = time.monotonic()
        probe = _probe(stack, spec, kubeconfig) if kubernetes and level is Level.FULL else None
        if kubernetes:
            obs = _sweep_cluster(stack, spec, kubeconfig, namespace, max_age, since, probe)
        elif slurm:
            assert publish_dir is not None
            obs = _sweep_slurm(stack, spec, publish_dir, max_age, since)
        elif state is None:
            # In a pod, the downward API's NODE_NAME names the node (the pod's hostname does not); under
            # slurmd (its HealthCheckProgram, a job step), SLURMD_NODENAME names it (srun(1)).
            target = HostTarget(node=node or os.environ.get("NODE_NAME") or os.environ.get("SLURMD_NODENAME")
                                or socket.gethostname(),
                                pool=pool.name, sku=pool.accelerator,
                                expected_gpus=pool.gpus_per_node,
                                expected_port_gbps=float(spec.fabric.link_speed_gbps),
                                rails=spec.fabric.rails_per_node)
            now = time.time()
            reads = read_host(target, now=now, kernel_log=kernel_log, fabric_ifs=fabric_if or (),
                              hcas=spec.fabric.hcas)
            obs = [observation_from_host(reads, target, at=now)]
        else:
            try:
                obs = SB.gather(state, pool=pool.name, sku=pool.accelerator, expected_gpus=pool.gpus_per_node,
                                expected_port_gbps=float(spec.fabric.link_speed_gbps), since=since)
            except AgentError as e:
                raise fail(str(e), 2) from None
        if node is not None and not here:
            obs = [o for o in obs if o.node == node]
            if not obs:
                raise InputError("--node", [Problem("--node", f"{node} is not a GPU node of stack {stack}")])
        if level is Level.FULL and state is not None:
            plan = plan_sweep([(o.node, o.sched_state) for o in obs], "full")
            figures = SB.measure(state, plan.pairs, plan.unpaired)
            obs = [o.model_copy(update={"perf": {SB.PERF_METRIC: figures[o.node]}}) if o.node in figures
                   else o for o in obs]
            if spec.inspect.perf_job is not None:
                try:
                    prefix = state.slurm_command()
                except RuntimeError as e:
                    raise fail(f"inspect.perfJob runs through Slurm: {e}", 2) from None
                obs = _perf_jobs(prefix, spec.inspect.perf_job, obs, [p.node for p in plan.nodes if p.full])
        elif level is Level.FULL and slurm:
            assert spec.inspect.perf_job is not None
            plan = plan_sweep([(o.node, o.sched_state) for o in obs], "full")
            obs = _perf_jobs((), spec.inspect.perf_job, obs, [p.node for p in plan.nodes if p.full])
        pins = {p.name: Pins(p.software.driver, p.software.firmware) for p in spec.node_pools}
        outcome = run_sweep(run_id=uuid.uuid4().hex[:12], stack=stack,
                            level="full" if level is Level.FULL else "light", at=time.time(),
                            observations=obs, past=past, thresholds=thresholds, xid_rules=rules, pins=pins,
                            floor_percent=floor, fault_actions={f.id: f.action for f in catalog})
        wall = time.monotonic() - t0
        if record and (node is None or state is None):
            H.append(path, outcome.records)
        doc = to_doc(outcome, catalog)
        doc["wall_seconds"] = round(wall, 3)
        if bundle and out is not None and (state is not None or kubernetes):
            from gpufleet.fleet.bundle.caps import SANDBOX_CAPS
            from gpufleet.fleet.bundle.service import (
                BundleInputError,
                bundles_for_failing_nodes,
                collect_kubernetes,
                collect_sandbox,
            )
            from gpufleet.fleet.inspect.report import attach_bundles, failing_nodes

            if state is not None:
                def collect_node(n: str, reason: str, d: Path) -> tuple[Path, Manifest]:
                    return collect_sandbox(state, n, d, SANDBOX_CAPS, trigger="inspect", reason=reason,
                                           detected_at=time.time())
            else:  # the cluster's view of the node and its containers' logs (ADR 0084)
                api = cluster_client(stack, kubeconfig, sandbox_default=True)

                def collect_node(n: str, reason: str, d: Path) -> tuple[Path, Manifest]:
                    return collect_kubernetes(api, n, d, SANDBOX_CAPS, stack=stack, trigger="inspect",
                                              reason=reason, detected_at=time.time())
            try:
                attach_bundles(doc, bundles_for_failing_nodes(collect_node, failing_nodes(doc), out))
            except BundleInputError as e:
                raise fail(f"--bundle: {e}", 2) from None
        if out is not None:
            written = write_reports(doc, out)
            if fmt is Format.TABLE:
                for p in written:
                    console.print(f"wrote {p}", highlight=False)
        worst = max((exit_code(r.result) for r in outcome.rows), default=0)
        if publish:
            _publish(obs[0], kubeconfig, namespace)
        if publish_dir is not None and here:
            _publish_file(obs[0], publish_dir)
        if fmt is Format.NPD:
            typer.echo(npd_message(outcome.rows[0].result))
            raise typer.Exit(worst)
        if here:  # the node's own code, as the plugin contracts read it
            if fmt is Format.JSON:
                print_json(doc)
            else:
                _table(doc)
            raise typer.Exit(worst)
        if fmt is Format.JSON:
            print_json(doc)
        else:
            _table(doc)
        raise typer.Exit(1 if any(r.result.status == "fail" for r in outcome.rows) else 0)


@dataclass(frozen=True)
class _Probe:
    """A full Kubernetes sweep's performance pod, and why a node cannot run it (None: it can)."""

    pod: NodePod
    cannot_run: Callable[[str], str | None]


def _probe(stack: str, spec: StackSpec, kubeconfig: Path | None) -> _Probe:
    """The stack's `inspect.perfPod`; on the stack's Kubernetes sandbox without one, gpufleet's
    collective probe on its kubelet nodes (a kwok node runs no container). Exit 2 when there is none."""
    from gpufleet.cli import node_pods
    from gpufleet.core.sandbox_contract import read_kube_state
    from gpufleet.fleet.node_pod import PROBE_APP

    pod = node_pods.perf_pod(spec, app=PROBE_APP)
    kubelet: frozenset[str] | None = None
    if kubeconfig is None:
        try:
            kubelet = frozenset(read_kube_state(stack).kubelet_nodes)
        except (OSError, ValueError):
            kubelet = None  # not the stack's sandbox: the default kubeconfig's cluster
    if kubelet is None:
        if pod is None:
            raise fail("--level full on Kubernetes measures the idle nodes with the stack's performance pod: "
                       f"stack {stack} sets no inspect.perfPod (docs/fleet-inspect.md)", 2)
        return _Probe(pod, lambda _n: None)
    if not kubelet:
        raise fail(f"--level full on the Kubernetes sandbox of {stack} runs the performance pod on its "
                   "kubelet nodes, and it has none (`gpufleet sandbox up --kubernetes --kubelet-nodes N`)", 2)
    return _Probe(pod or node_pods.sandbox_perf_pod(spec, PROBE_APP),
                  lambda n: None if n in kubelet else "a kwok node runs no container")


def _perf_jobs(prefix: Sequence[str], job: PerfJob, obs: list[NodeObservation], heavy: list[str]
               ) -> list[NodeObservation]:
    """The stack's performance job through Slurm (`prefix`: how Slurm commands run here) on each node
    the plan lets the heavy checks run on, one node at a time (ADR 0086); its figures join the node's,
    and a node it could not measure is UNKNOWN, with why."""
    from gpufleet.fleet.inspect.perf_job import run_job

    out = []
    for o in obs:
        if o.node not in heavy:
            out.append(o)
            continue
        if o.sched_state == "drained":  # Slurm starts no job there (srun waits, then gives up)
            out.append(o.model_copy(update={"unknown": (*o.unknown, "perf: drained: Slurm starts no job on "
                                                                     "a drained node")}))
            continue
        figures, why = run_job(prefix, o.node, job.command, job.deadline_seconds, job.srun_args)
        if figures:
            out.append(o.model_copy(update={"perf": {**o.perf, **figures}}))
        else:
            out.append(o.model_copy(update={"unknown": (*o.unknown, f"perf: {why}")}))
    return out


def _sweep_cluster(stack: str, spec: StackSpec, kubeconfig: Path | None, namespace: str | None,
                   max_age: float | None, since: dict[str, float], probe: _Probe | None
                   ) -> list[NodeObservation]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpufleet.core.inspect_contract import DEFAULT_MAX_AGE_S, INSPECT_NAMESPACE
    from gpufleet.fleet.inspect import cluster as C

    client = cluster_client(stack, kubeconfig, sandbox_default=True)
    pools = {p.name: C.PoolShape(p.accelerator, p.gpus_per_node) for p in spec.node_pools}
    try:
        nodes, cms, pods = C.read_cluster(client, namespace or INSPECT_NAMESPACE)
    except (ApiException, HTTPError) as e:
        raise fail(f"reading the cluster: {str(e).strip()[:300]}", 2) from None
    obs = C.observations_from_cluster(nodes, cms, pods, pools, now=time.time(),
                                      max_age_s=max_age or DEFAULT_MAX_AGE_S, since=since)
    return obs if probe is None else _measure(client, obs, probe)


def _sweep_slurm(stack: str, spec: StackSpec, publish_dir: Path, max_age: float | None,
                 since: dict[str, float]) -> list[NodeObservation]:
    """Every node of the stack's pools on the Slurm cluster whose commands run here (ADR 0088)."""
    from gpufleet.config.model import StaticProvisioning
    from gpufleet.core.inspect_contract import DEFAULT_MAX_AGE_S
    from gpufleet.fleet.inspect import slurm_cluster as S
    from gpufleet.fleet.inspect.cluster import PoolShape
    from gpufleet.fleet.inspect.exclusions import job_exclusions

    pools = [S.SlurmPool(p.name, PoolShape(p.accelerator, p.gpus_per_node),
                         frozenset(p.provisioning.node_names or ())
                         if isinstance(p.provisioning, StaticProvisioning) else frozenset())
             for p in spec.node_pools]
    try:
        nodes = S.read_slurm_nodes()
        names = sorted(n for n, sn in nodes.items() if S.pool_of(sn, pools) is not None)
        if not names:
            raise fail(f"no Slurm node belongs to a pool of stack {stack} "
                       f"({', '.join(p.name for p in pools)}): a pool is matched by its "
                       "provisioning.nodeNames, else a Slurm feature or partition of its name "
                       "(docs/fleet-inspect.md)", 2)
        jobs = S.read_slurm_jobs()
    except S.SlurmReadError as e:
        raise fail(f"reading Slurm: {e}", 2) from None
    texts, unreadable = S.read_published(publish_dir, names)
    return S.observations_from_slurm(nodes, texts, unreadable, pools, now=time.time(),
                                     max_age_s=max_age or DEFAULT_MAX_AGE_S,
                                     exclusions=job_exclusions(jobs, since))


def _measure(client: object, obs: list[NodeObservation], probe: _Probe) -> list[NodeObservation]:
    """The performance pod on each node inspect's plan lets the heavy checks run on, one node at a
    time (each bounded by the pod's deadline); what it could not measure is UNKNOWN, with why."""
    from gpufleet.fleet.inspect.plan import plan_sweep
    from gpufleet.fleet.node_pod import NodePodError, perf_figures, run_on_node

    plan = {p.node: p for p in plan_sweep([(o.node, o.sched_state) for o in obs], "full").nodes}
    run_id = f"sweep-{uuid.uuid4().hex[:8]}"
    out = []
    for o in obs:
        if not plan[o.node].full:
            out.append(o)
            continue
        why = probe.cannot_run(o.node)
        if why is None:
            try:
                run = run_on_node(client, probe.pod, o.node, run_id)
            except NodePodError as e:
                raise fail(f"running the performance pod on {o.node}: {e}", 2) from None
            figures, problem = perf_figures(run.message) if run.passed else ({}, run.detail)
            if figures:
                out.append(o.model_copy(update={"perf": figures}))
                continue
            why = problem if not run.passed else f"perf pod exit 0 but {problem}"
        out.append(o.model_copy(update={"unknown": (*o.unknown, f"perf: {why}")}))
    return out


def _publish(obs: NodeObservation, kubeconfig: Path | None, namespace: str | None) -> None:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpufleet.core.inspect_contract import INSPECT_NAMESPACE, POD_NAME_ENV, configmap_name
    from gpufleet.fleet.inspect import cluster as C

    client = cluster_client("", kubeconfig, sandbox_default=False)
    ns = namespace or INSPECT_NAMESPACE
    try:
        name = C.publish(client, obs, ns, os.environ.get(POD_NAME_ENV))
    except (ApiException, HTTPError) as e:
        raise fail(f"--publish: writing ConfigMap {configmap_name(obs.node)} in {ns}: "
                   f"{str(e).strip()[:300]}", 2) from None
    typer.echo(f"published {ns}/{name}", err=True)  # stdout is the node's verdict (the plugin contract)


def _check_publish_dir(path: Path, *, write: bool) -> None:
    """The folder --here writes to (it must take a new file) or --slurm reads from, checked before
    any reading."""
    from gpufleet.core.errors import InputError, Problem

    if not path.is_dir():
        raise InputError("--publish-dir", [Problem(str(path), "not a directory")])
    if write and not os.access(path, os.W_OK | os.X_OK):
        raise InputError("--publish-dir", [Problem(str(path), "not writable by this user")])


def _publish_file(obs: NodeObservation, directory: Path) -> None:
    from gpufleet.fleet.inspect.slurm_cluster import write_published

    try:
        path = write_published(obs, directory)
    except (OSError, ValueError) as e:
        raise fail(f"--publish-dir: writing {obs.node}'s result in {directory}: {e}", 2) from None
    typer.echo(f"published {path}", err=True)  # stdout is the node's verdict (the plugin contract)


def _table(doc: dict[str, object]) -> None:
    from rich.table import Table

    t = Table(title=f"gpufleet inspect {doc['stack']} ({doc['level']}) in {doc['wall_seconds']} s")
    for col in ("node", "status", "checks", "findings", "lemon"):
        t.add_column(col)
    nodes = doc["nodes"]
    assert isinstance(nodes, list)
    for n in nodes:
        findings = "; ".join([*(f"{f['code']} {f['name']} {f['subject']}" for f in n["findings"]),
                              *(f"unknown: {u}" for u in n["unknown"])])
        t.add_row(n["node"], n["status"], "full" if n["full"] else "light", findings or "-",
                  n["lemon"]["reason"] if n["lemon"] else "")
    console.print(t)
