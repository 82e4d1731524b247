"""`gpufleet upgrade plan`: the waves of a rolling driver or firmware upgrade (docs/fleet-upgrade.md)."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from gpufleet.cli import node_pods
from gpufleet.cli.common import console, input_errors, print_json
from gpufleet.config import StackSpec, load_named_stack, load_stack
from gpufleet.config.gpu_operator import UPGRADE_REQUIRED
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inspect_contract import PUBLISHER_NAMESPACE
from gpufleet.fleet.inspect.cluster import PoolShape as ClusterPoolShape
from gpufleet.fleet.node_pod import NodePod
from gpufleet.fleet.upgrade import (
    Component,
    UpgradePlan,
    load_snapshot,
    plan_upgrade,
    snapshot_from_stack,
    with_protection,
)
from gpufleet.fleet.upgrade.drive import drive
from gpufleet.fleet.upgrade.gate import GateSetup
from gpufleet.fleet.upgrade.kube_driver import PUBLISHER_SELECTOR, GpuOperatorDriver, InspectStep, PerfStep
from gpufleet.fleet.upgrade.model import protection
from gpufleet.fleet.upgrade.rollout import Rollout
from gpufleet.fleet.upgrade.sandbox_driver import RECORD_FILE, DriverError, PoolShape, SandboxDriver
from gpufleet.fleet.upgrade.slurm_driver import SlurmDriver, choose_driver

if TYPE_CHECKING:
    from gpufleet.core.sandbox_contract import KubeSandboxState

# A driver (570.124.06), firmware (96.00.9F.00.04) or package version (2.19.3-1+cuda12.8): what a
# version string may hold, so a typo such as an empty string or a flag is refused before planning.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~:-]{0,63}$")

STACK_SOURCE_NOTE = (
    "Fleet snapshot: the stack's node pools, no live backend given. Current versions, cordons and "
    "running jobs are unknown, so every node is planned; a rollout needs a live snapshot (--snapshot)."
)

upgrade_app = typer.Typer(help="Rolling driver and firmware upgrades: canary, waves, gates, rollback.",
                          no_args_is_help=True)


def _version(value: str) -> str:
    if not _VERSION.match(value):
        raise typer.BadParameter(
            f"{value!r} is not a version (letters, digits and . _ + ~ : -, starting with a letter or digit)"
        )
    return value


def _maybe_version(value: str | None) -> str | None:
    return None if value is None else _version(value)


def _names(nodes: tuple[str, ...], shown: int = 4) -> str:
    if len(nodes) <= shown:
        return ", ".join(nodes)
    return f"{', '.join(nodes[: shown - 1])}, ... {nodes[-1]}"


def print_plan(plan: UpgradePlan, stack_file: str) -> None:
    p = plan.policy
    title = f"[bold]Upgrade plan[/] {plan.component.value} -> {plan.target}  ({stack_file})"
    console.print(title, highlight=False)
    console.print(
        f"policy: canary {p.canary_nodes_per_pool}/pool, waves of {p.wave_size}, maxUnavailable "
        f"{p.max_unavailable}, bake {p.bake_seconds:g} s; timeouts: protected jobs "
        f"{p.protected_job_wait_seconds:g} s, drain {p.drain_timeout_seconds:g} s, reboot "
        f"{p.reboot_timeout_seconds:g} s, gate {p.gate_timeout_seconds:g} s",
        highlight=False,
    )
    table = Table(title_justify="left")
    for col in ("wave", "nodes", "first ... last"):
        table.add_column(col)
    for w in plan.waves:
        table.add_row("canary" if w.canary else str(w.index), str(len(w.nodes)), _names(w.nodes))
    console.print(table)
    console.print(
        f"planned {plan.planned_nodes} node(s) in {len(plan.waves)} wave(s); up to date "
        f"{len(plan.up_to_date)}; left out {len(plan.left_out)}",
        highlight=False,
    )
    for skip in plan.left_out:
        line = f"  left out {skip.node}: {skip.reason.value} ({skip.detail})"
        console.print(line, highlight=False, markup=False)
    if plan.source == "stack":
        console.print(f"[yellow]{STACK_SOURCE_NOTE}[/]", highlight=False)


@upgrade_app.command("plan")
@input_errors
def plan_cmd(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name or stack file")],
    to: Annotated[str, typer.Option("--to", help="Target version", callback=_version)],
    component: Annotated[Component, typer.Option("--component", help="What is upgraded")] = Component.DRIVER,
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", help="A fleet snapshot file (JSON/YAML: nodes, versions, cordons, jobs); "
                                        "default: the stack's node pools"),
    ] = None,
    stacks_dir: Annotated[Path, typer.Option("--stacks-dir", help="Where stack files live")] = Path("stacks"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
) -> None:
    """Plan a rolling upgrade: canary nodes per pool, then waves under the stack's `upgrade` policy;
    nodes cordoned by others or unhealthy are left out with their reason."""
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.exists():
        spec, stack_file = load_stack(p), str(p)
    else:
        spec, stack_file = load_named_stack(stack, stacks_dir), str(stacks_dir / f"Pulumi.{stack}.yaml")
    if snapshot is None:
        fleet = snapshot_from_stack(spec, component)
    else:
        fleet = load_snapshot(snapshot)
        if fleet.component is not component:
            message = (f"the snapshot observed the {fleet.component.value}, not the {component.value} "
                       "(--component)")
            raise InputError(str(snapshot), [Problem("component", message)])
    plan = plan_upgrade(with_protection(fleet, spec.upgrade), spec.upgrade, to)
    if as_json:
        doc = plan.to_doc()
        if plan.source == "stack":
            doc["note"] = STACK_SOURCE_NOTE
        print_json(doc)
    else:
        print_plan(plan, stack_file)


def _stack(stack: str, stacks_dir: Path) -> tuple[StackSpec, str]:
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return load_stack(p), p.stem.removeprefix("Pulumi.")
    return load_named_stack(stack, stacks_dir), stack


def _smoke_ranks(spec: StackSpec) -> int:
    """The gate's smoke run uses the training job's ranks per node (one without a sandbox section)."""
    return spec.sandbox.training.ranks_per_node if spec.sandbox is not None else 1


def gate_setup(spec: StackSpec, component: Component) -> tuple[GateSetup, dict[str, PoolShape]]:
    """The stack's gate (`upgrade.gate`) with what inspect checks against: the catalog's XID policy
    with the stack's overrides, the thresholds, each pool's pins and shape."""
    from gpufleet.catalog import load_catalog, xid_policy
    from gpufleet.fleet.inspect.checks import Pins
    from gpufleet.fleet.inspect.thresholds import load_thresholds

    catalog = load_catalog()
    rules, problems = xid_policy(catalog, spec.remediation.xid_overrides)
    if problems:
        raise InputError("remediation.xidOverrides", problems)
    gate = spec.upgrade.gate
    setup = GateSetup(
        level=gate.inspect_level, floor_percent=gate.performance_floor_percent, thresholds=load_thresholds(),
        xid_rules=rules, component=component,
        pins={p.name: Pins(p.software.driver, p.software.firmware) for p in spec.node_pools},
        fault_actions={f.id: f.action for f in catalog},
        smoke_ranks=_smoke_ranks(spec) if gate.smoke_run else 0)
    shapes = {p.name: PoolShape(p.accelerator, p.gpus_per_node, float(spec.fabric.link_speed_gbps))
              for p in spec.node_pools}
    return setup, shapes


def _gpu_operator_driver(spec: StackSpec, name: str, component: Component, state_root: Path | None,
                        kubeconfig: Path | None) -> GpuOperatorDriver:
    """The cluster's (--kubeconfig) or the stack's Kubernetes sandbox's GPU Operator. On the sandbox
    a version in `sandbox.badVersions` gets kwok's failure annotation on the driver pod template."""
    smoke = node_pods.smoke_pod(spec)
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise InputError("--kubeconfig", [Problem(str(kubeconfig), "not a file")])
        return GpuOperatorDriver(kubeconfig, component, Path(".gpufleet/upgrade") / f"{name}-cordons.json",
                                 smoke=smoke, perf_pod=node_pods.perf_pod(spec))
    from gpufleet.core.sandbox_contract import kube_state_path, read_kube_state
    from gpufleet.sandbox.kube.gpu_operator import FAILS_TO_LOAD

    state = read_kube_state(name, state_root)
    if state.admin_kubeconfig is None:
        raise DriverError(f"the Kubernetes sandbox of {name} records no admin kubeconfig")
    bad = frozenset(spec.sandbox.bad_versions if spec.sandbox else ())
    record = kube_state_path(name, state_root).with_name(RECORD_FILE)

    def annotations(version: str) -> dict[str, str | None]:
        return {FAILS_TO_LOAD: "true" if version in bad else None}

    perf = node_pods.perf_pod(spec)
    if not state.kubelet_nodes:
        return GpuOperatorDriver(Path(state.admin_kubeconfig), component, record,
                                 template_annotations=annotations, smoke=smoke, perf_pod=perf)
    stage, smoke, perf, no_pods = _kubelet_node_parts(spec, state, smoke, perf)
    return GpuOperatorDriver(Path(state.admin_kubeconfig), component, record,
                             template_annotations=annotations, smoke=smoke, perf_pod=perf, stage=stage,
                             no_pods=no_pods)


def _kubelet_node_parts(spec: StackSpec, state: KubeSandboxState, smoke: NodePod | None,
                        perf: NodePod | None) -> tuple[Callable[[str], None], NodePod | None, NodePod | None,
                                                       Callable[[str], str | None]]:
    """On a Kubernetes sandbox with kubelet nodes (ADR 0081): a version's driver image is tagged on
    them before the DaemonSet names it, and with `gate.smokeRun` (and no smokePod of the stack's)
    the gate's smoke pod is gpufleet's own one-step run (ADR 0082), on the kubelet nodes; with a
    full `gate.inspectLevel` (and no perfPod of the stack's) the performance pod is gpufleet's own
    collective probe (ADR 0083). A kwok node runs no container, so its gate says it had neither."""
    from gpufleet.sandbox.kube import kubelet_node, require_kube_paths
    from gpufleet.sandbox.kube.gpu_operator import DRIVER_IMAGE

    ctr = require_kube_paths().binaries["ctr"]
    kubelet = frozenset(state.kubelet_nodes)

    def stage(version: str) -> None:
        kubelet_node.tag_on_nodes(state, f"{DRIVER_IMAGE}:{version}", ctr)

    def no_pods(node: str) -> str | None:
        return None if node in kubelet else "a kwok node runs no container"

    if spec.upgrade.gate.smoke_run and smoke is None:
        smoke = node_pods.sandbox_smoke_pod(spec, _smoke_ranks(spec))
    if spec.upgrade.gate.inspect_level == "full" and perf is None:
        perf = node_pods.sandbox_perf_pod(spec)
    return stage, smoke, perf, no_pods


def _perf_step(driver: GpuOperatorDriver, spec: StackSpec, setup: GateSetup) -> PerfStep | None:
    """The gate's performance floor (ADR 0083) when the gate is full and there is a performance pod:
    each pool's reference measured first by that pod on idle nodes (a SKU's published figure wins,
    as in `gpufleet inspect`); printed either way."""
    from gpufleet.fleet.inspect.observation import NodeObservation as InspectObservation
    from gpufleet.fleet.inspect.reference import pool_references

    def say(line: str) -> None:
        console.print(f"gate: {line}", highlight=False, markup=False)

    if setup.level != "full":
        say("no performance floor: upgrade.gate.inspectLevel is light")
        return None
    if driver.perf_pod is None:
        say("no performance floor: inspect.perfPod is not set (docs/fleet-upgrade.md)")
        return None
    measured = driver.measure_references(driver.perf_pod, node_pods.reference_nodes(spec),
                                         node_pods.reference_runs(spec), say)
    shapes = {p.name: p for p in spec.node_pools}
    observed = [InspectObservation(node=node, pool=pool, sku=shapes[pool].accelerator, at=time.time(),
                                   expected_gpus=shapes[pool].gpus_per_node, perf=figures)
                for pool, nodes in measured.items() if pool in shapes for node, figures in nodes.items()]
    refs = {pool: dict(r) for pool, r in pool_references(observed, setup.thresholds).items()}
    say(f"performance floor {setup.floor_percent:g}% of " + (", ".join(
        f"{pool} {m} {r.value:g} ({r.source})" for pool, ms in sorted(refs.items())
        for m, r in sorted(ms.items())) or "no reference (no idle node measured)"))
    return PerfStep(driver.perf_pod, dataclasses.replace(setup, references=refs))


def _inspect_step(driver: GpuOperatorDriver, spec: StackSpec, setup: GateSetup) -> InspectStep | None:
    """The gate's inspect step when the cluster runs the stack's publisher (ADR 0075); printed
    either way, since without it the gate is the operator's validation alone."""
    if not driver.has_publisher():
        console.print(f"gate: the operator's validation only: no inspect publisher ({PUBLISHER_SELECTOR}) "
                      f"DaemonSet in {PUBLISHER_NAMESPACE} (the stack's FleetInspect)",
                      highlight=False, markup=False)
        return None
    console.print("gate: the operator's validation, then inspect light on the node's own reading "
                  "(its publisher pod restarted through the new driver)", highlight=False, markup=False)
    pools = {p.name: ClusterPoolShape(p.accelerator, p.gpus_per_node) for p in spec.node_pools}
    return InspectStep(dataclasses.replace(setup, level="light"), pools, spec.upgrade.gate_timeout_seconds)


def _resume_cleanup(driver: SandboxDriver | GpuOperatorDriver) -> int:
    rec = driver.record
    if not rec.nodes:
        console.print(f"nothing to clean up: {rec.path} records no node", highlight=False)
        return 0
    if isinstance(driver, GpuOperatorDriver):
        for node in rec.open_nodes():
            returned = driver.uncordon(node)
            what = "uncordoned" if returned else "left as it is (no longer this run's mark)"
            console.print(f"{node}: driver {driver.version(node)}; {what}", highlight=False, markup=False)
        return 0
    for node in rec.open_nodes():
        started = driver.restart_missing_daemons(node)
        version = driver.version(node)
        returned = driver.uncordon(node)
        console.print(f"{node}: restarted {started or 'nothing'}; reports {version}; "
                      f"{'resumed' if returned else 'left as it is (its reason is no longer the mark)'}",
                      highlight=False, markup=False)
    held = [n for n, s in rec.nodes.items() if s == "held"]
    if held:
        console.print(f"held for people (not resumed): {', '.join(held)}", highlight=False)
    return 0


@upgrade_app.command("run")
@input_errors
def run_cmd(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name or stack file (a running sandbox)")],
    to: Annotated[str | None, typer.Option("--to", help="Target version", callback=_maybe_version)] = None,
    component: Annotated[Component, typer.Option("--component", help="What is upgraded")] = Component.DRIVER,
    driver_name: Annotated[str | None, typer.Option(
        "--driver", help="slurm (scontrol reboot; the default for a Slurm stack) or sandbox (daemon restart)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Read the live fleet and plan only")] = False,
    resume_cleanup: Annotated[
        bool, typer.Option("--resume-cleanup", help="Return the nodes an interrupted run left cordoned "
                                                    "(restarting daemons it had stopped); then exit")
    ] = False,
    report: Annotated[Path | None, typer.Option("--report", help="Where to write the JSON report")] = None,
    state_root: Annotated[Path | None, typer.Option(
        "--state-root", help="Sandbox state root (default: $GPUFLEET_SANDBOX_ROOT or /run/gpufleet/...)")
    ] = None,
    stacks_dir: Annotated[Path, typer.Option("--stacks-dir", help="Where stack files live")] = Path("stacks"),
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="--driver gpu-operator: the cluster (default: the stack's Kubernetes sandbox)")
    ] = None,
) -> None:
    """Run a rolling upgrade on the stack's sandbox (Slurm, or Kubernetes through the GPU Operator) or,
    with --kubeconfig, a Kubernetes cluster running the GPU Operator: canary, waves, gate, rollback
    of a failed node. Exit 0 done, 1 halted, 2 bad input."""
    spec, name = _stack(stack, stacks_dir)
    setup, shapes = gate_setup(spec, component)
    pool_of = {n: p.name for p in spec.node_pools for n in p.node_names()}
    try:
        chosen = choose_driver(spec.scheduler.kind.value, driver_name)
    except ValueError as e:
        raise InputError("--driver", [Problem("--driver", str(e))]) from e
    driver: SandboxDriver | GpuOperatorDriver
    try:
        if chosen == "gpu-operator":
            driver = _gpu_operator_driver(spec, name, component, state_root, kubeconfig)
        else:
            driver = (SlurmDriver if chosen == "slurm" else SandboxDriver)(
                name, component, state_root, gate_setup=setup, pools=shapes, pool_of=pool_of)
    except (OSError, ValueError, DriverError) as e:
        raise InputError(f"sandbox {name}", [Problem("state", f"no running sandbox to upgrade: {e}")]) from e
    if resume_cleanup:
        raise typer.Exit(_resume_cleanup(driver))
    if to is None:
        raise InputError("--to", [Problem("--to", "a target version is needed (or --resume-cleanup)")])
    if driver.record.open_nodes():
        raise InputError(str(driver.record.path), [Problem(
            "nodes", f"an earlier run left {', '.join(driver.record.open_nodes())} cordoned: "
                     "run `gpufleet upgrade run --resume-cleanup` first")])
    live = driver.snapshot() if isinstance(driver, GpuOperatorDriver) else driver.snapshot(pool_of)
    fleet = with_protection(live, spec.upgrade)
    plan = plan_upgrade(fleet, spec.upgrade, to)
    print_plan(plan, name)
    if dry_run:
        return
    if isinstance(driver, GpuOperatorDriver):
        driver.hand_over([n.name for n in fleet.nodes])
        driver.inspect = _inspect_step(driver, spec, setup)
        driver.perf = _perf_step(driver, spec, setup)
    elif setup.level == "full":
        # The performance floor's reference, as inspect computes it, before any node is taken.
        refs = driver.measure_references()
        driver.gate_setup = dataclasses.replace(setup, references=refs)
        console.print("gate: inspect full, performance floor "
                      f"{setup.floor_percent:g}% of " + (", ".join(
                          f"{pool} {m} {r.value:.0f} ({r.source})" for pool, ms in refs.items()
                          for m, r in ms.items()) or "no reference (no idle pair to measure)"),
                      highlight=False, markup=False)
    rollout_id = f"{name}-{int(time.time())}"
    rollout = Rollout(plan, fleet, rollout_id)
    driver.record.rollout_id, driver.record.mark = rollout_id, rollout.mark
    driver.record.save()

    def on_term(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        result = drive(rollout, driver, protect=lambda j: protection(spec.upgrade, j),
                       say=lambda m: console.print(m, highlight=False, markup=False))
    except KeyboardInterrupt:
        still = ", ".join(driver.record.open_nodes()) or "none"
        console.print(f"[red]interrupted[/]: nodes still cordoned by this run: {still} "
                      f"(recorded in {driver.record.path}); "
                      "`gpufleet upgrade run --stack " + name + " --resume-cleanup` returns them",
                      highlight=False)
        raise typer.Exit(1) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    if isinstance(driver, GpuOperatorDriver):
        try:
            stale = driver.hand_back()
        except DriverError as e:  # the rollout is over: its report is written all the same
            stale = []
            console.print(f"hand back: {e}", highlight=False, markup=False)
        if stale:
            console.print(f"handed back: cleared the operator's stale {UPGRADE_REQUIRED} on "
                          f"{', '.join(stale)} (their driver pods run the DaemonSet's version)",
                          highlight=False, markup=False)
    doc = {"stack": name, "component": component.value, "rolloutId": rollout_id, "driver": chosen,
           **result.to_doc()}
    if isinstance(driver, SlurmDriver):
        doc.update(driver.report())
    gate = spec.upgrade.gate
    floor = f" with the performance floor {gate.performance_floor_percent:g}%"
    checks = (f"gate: node-health + inspect {gate.inspect_level}"
              + (floor if gate.inspect_level == "full" else "") + " + version read back")
    doc["gateNote"] = checks + (" + a one-step training smoke run on the node" if gate.smoke_run
                                else " (gate.smokeRun is off)")
    if isinstance(driver, GpuOperatorDriver):
        doc["gateNote"] = ("gate: the GPU Operator's upgrade-done, the node's driver pod at the version and "
                           "ready, its validator pods ready, the node Ready without a GpuFleetProblem "
                           "condition" + (", then inspect light on the node's own reading after its "
                                          "publisher restarted" if driver.inspect else
                                          " (no inspect publisher on the cluster)")
                           + (f", then the performance pod ({driver.perf.pod.image}) at the floor "
                              f"{gate.performance_floor_percent:g}% of the pool's reference" if driver.perf
                              else " (no performance floor)")
                           + (f", then the smoke pod ({driver.smoke.image}) on the node" if driver.smoke
                              else " (no smoke run: upgrade.gate.smokePod is not set; "
                                   "docs/fleet-upgrade.md)"))
    out = report or driver.record.path.with_name(f"upgrade-{rollout_id}.json")
    out.write_text(json.dumps(doc, indent=2))
    cap = result.capacity()
    console.print(
        f"{'HALTED: ' + str(rollout.halted_by) if rollout.halted_by else 'done'}; counts {doc['counts']}; "
        f"drained {cap['drainedNodeSeconds']} node-s vs minimum {cap['minimumNodeSeconds']} "
        f"(ratio {cap['ratio']}); wall {cap['wallSeconds']} s; report {out}",
        highlight=False, markup=False,
    )
    raise typer.Exit(1 if rollout.halted_by else 0)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.add_typer(upgrade_app, name="upgrade")
