"""`gpufleet sandbox up`: build a sandbox run from a stack, recording everything in its state file.

Order (what waits on what):
  network ─► munged ─► slurmctld ─┐
          ├► prometheus + forwarder├─► slurmd per node ─► all nodes idle ─► sbatch ─► progressing
          └► node agents (healthy) ┘
Agents come before slurmd because slurmd runs the health check at once, and a check that cannot
reach its agent must not be mistaken for a healthy node.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpufleet.config.model import StackSpec
from gpufleet.core import juicefs as jfs
from gpufleet.core.haproxy_stats import server_states
from gpufleet.core.promapi import PrometheusClient
from gpufleet.core.s3 import S3Location
from gpufleet.core.sandbox_contract import FabricLink, SandboxNode, state_path
from gpufleet.core.storage_contract import StorageSandboxState, read_storage_state, storage_state_path
from gpufleet.sandbox import agents, network, prometheus, slurm, slurm_state_backup, workload
from gpufleet.sandbox.configs import hosts_json
from gpufleet.sandbox.layout import AGENT_PORT, MGMT_IFNAME, Layout, new_run_id, plan_layout
from gpufleet.sandbox.processes import Started, Timings
from gpufleet.sandbox.readiness import wait_for
from gpufleet.sandbox.serving import start as serving_start
from gpufleet.sandbox.state import Recorder, existing, new_state
from gpufleet.sandbox.storage import juicefs, s3_job


class SandboxError(RuntimeError):
    """A sandbox operation cannot proceed; the message says what to do."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            "the sandbox needs root (network namespaces, veth links, Slurm daemons): "
            "run as root, e.g. `sudo .venv/bin/gpufleet sandbox up`; `gpufleet sandbox doctor` lists "
            "everything else it needs"
        )


@dataclass
class UpOptions:
    rule_files: list[Path] | None = None  # default: the repo's generated rule file
    agents: bool = True
    training: bool = True
    serving: bool = True  # the stack's sandbox.serving workload, when it has one
    timeout_s: float = 180.0
    python: str = sys.executable
    gpufleet_bin: Path = field(default_factory=lambda: Path(sys.executable).parent / "gpufleet")



def contract_nodes(layout: Layout) -> list[SandboxNode]:
    head = layout.head
    out = [
        SandboxNode(
            name=head.name,
            role="head",
            netns=head.netns,
            mgmt_ifname=MGMT_IFNAME,
            mgmt_peer=head.mgmt_peer,
            mgmt_address=head.mgmt_cidr,
        )
    ]
    for n in layout.nodes:
        out.append(
            SandboxNode(
                name=n.name,
                role="compute" if n.role == "compute" else "serving" if n.role == "serving" else "spare",
                netns=n.netns,
                mgmt_ifname=MGMT_IFNAME,
                mgmt_peer=n.mgmt_peer,
                mgmt_address=n.mgmt_cidr,
                fabric=[FabricLink(rail=r, ifname=i, peer=p, address=f"{ip}/24") for r, i, p, ip in n.fabric],
                gpus=n.gpus,
                agent_socket=str(layout.agent_socket(n.name)),
                agent_metrics_url=f"http://{n.mgmt_ip}:{AGENT_PORT}/metrics",
                kernel_log=str(layout.kernel_log(n.name)),
                leaf=n.leaf,
            )
        )
    return out


def up(
    stack: str,
    spec: StackSpec,
    options: UpOptions | None = None,
    root: Path | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[Recorder, Timings]:
    """Bring a sandbox up. On failure the state file (phase `failed`) still names everything made,
    so `down` removes it; the error names the log to read."""
    opts = options or UpOptions()
    require_root()
    prior = existing(stack, root)
    if prior.state is not None or prior.error is not None:
        which = f"run {prior.state.run_id}, phase {prior.state.phase}" if prior.state else prior.error
        raise SandboxError(
            f"a sandbox for stack {stack!r} already exists ({which}); "
            f"run `gpufleet sandbox down --stack {stack}` first"
        )
    run_id = new_run_id()
    base = state_path(stack, root).parent / f"run-{run_id}"
    layout = plan_layout(stack, spec, run_id, base)  # InputError before anything is made
    link = _storage_link(stack, spec, root, run_id, opts.training)
    if opts.training:  # without the job nothing checkpoints: no storage sandbox needed
        layout = replace(layout, checkpoint_root=_checkpoints_on_storage(stack, spec, root, run_id))
    if link.job is not None:
        layout = replace(layout, checkpoint_s3=base / "training" / "s3-location.json")
    if link.bundles is not None:
        layout = replace(layout, bundle_ship=base / "bundles" / "ship.json")
    timings = Timings()
    base.mkdir(parents=True, mode=0o755)
    rec = Recorder(new_state(stack, run_id, base), root)
    try:
        _bring_up(layout, spec, opts, rec, timings, say, link)
    except BaseException:
        rec.update(phase="failed")
        raise
    rec.update(phase="up")
    timings.mark("up")
    return rec, timings


def _storage_state(stack: str, root: Path | None) -> StorageSandboxState | None:
    path = storage_state_path(stack, root)
    try:
        return read_storage_state(stack, root) if path.exists() else None
    except (OSError, ValueError) as e:
        raise SandboxError(f"the storage sandbox's state file {path} is unreadable: {e}") from None


def _checkpoints_on_storage(stack: str, spec: StackSpec, root: Path | None, run_id: str) -> Path | None:
    """The training job's folder on the stack's JuiceFS volume, when the stack checkpoints there."""
    if juicefs.checkpoint_folder(spec) is None:
        return None
    return juicefs.training_checkpoint_dir(stack, spec, _storage_state(stack, root), jfs.mounted, run_id)


@dataclass(frozen=True)
class StorageLink:
    """What the nodes reach of the stack's storage sandbox through the relay on their loopback."""

    radosgw_port: int | None = None  # None: no storage sandbox up, no relay
    job: S3Location | None = None  # the training job's checkpoints, straight to S3 (ADR 0070)
    bundles: S3Location | None = None  # where the nodes ship their diagnostic bundles


def _storage_link(stack: str, spec: StackSpec, root: Path | None, run_id: str, training: bool) -> StorageLink:
    storage = _storage_state(stack, root)
    # InputError when the stack checkpoints to S3 and the storage sandbox cannot take it.
    job = s3_job.job_target(stack, spec, storage, run_id) if training else None
    port = s3_job.radosgw_port(storage)
    return StorageLink(port, job, s3_job.bundle_target(storage)) if port is not None else StorageLink()


def _record(rec: Recorder, started: Started) -> Started:
    rec.add_process(started.record)
    return started


def _check_alive(started: list[Started]) -> None:
    for s in started:
        code = s.popen.poll()
        if code is not None:
            raise SandboxError(f"{s.record.name} exited with code {code} during bring-up")


def _bring_up(
    layout: Layout,
    spec: StackSpec,
    opts: UpOptions,
    rec: Recorder,
    timings: Timings,
    say: Callable[[str], None],
    link: StorageLink = StorageLink(),
) -> None:
    rec.update(
        nodes=contract_nodes(layout),
        head_netns=layout.head.netns,
        spare_nodes=[n.name for n in layout.spare_nodes],
        slurm_conf=str(layout.slurm_conf),
        agent_token_file=str(layout.token_file),
        checkpoint_dir=str(layout.checkpoint_dir),
        checkpoint_s3=None if layout.checkpoint_s3 is None else str(layout.checkpoint_s3),
        training_events=str(layout.events_file),
        training_hosts_file=str(layout.hosts_file),
    )
    say(
        f"run {layout.run_id}: creating {len(layout.namespaces)} namespaces and {len(layout.bridges)} bridges"
    )
    network.create(layout, rec.add_names)
    timings.mark("network")

    agents.write_token(layout.token_file)
    slurm.write_configs(layout, opts.gpufleet_bin)
    layout.hosts_file.write_text(hosts_json(layout))
    rules = opts.rule_files if opts.rule_files is not None else [prometheus.repo_rule_file()]
    prom_conf = prometheus.write_config(layout, rules)

    started: list[Started] = []
    started.append(_record(rec, slurm.start_munged(layout)))
    started.append(_record(rec, prometheus.start(layout, prom_conf, spec.monitoring.retention)))
    fwd, port_file = prometheus.start_forwarder(layout)
    started.append(_record(rec, fwd))
    relay_port_file = None
    if link.radosgw_port is not None:
        # up() set the layout's paths from the same link: both are set or neither.
        if link.job is not None and layout.checkpoint_s3 is not None:
            s3_job.write_location(layout.checkpoint_s3, link.job)
        if link.bundles is not None and layout.bundle_ship is not None:
            s3_job.write_location(layout.bundle_ship, link.bundles)
        relay_port_file = layout.path("s3-relay", "port")
        started.append(_record(rec, s3_job.start_relay(
            [n.netns for n in layout.slurm_nodes], link.radosgw_port, relay_port_file,
            layout.path("s3-relay", "relay.log"), opts.python)))
    if opts.agents:
        for n in layout.nodes:
            started.append(_record(rec, agents.start_agent(layout, n.name)))
    wait_for("munged's socket", lambda: layout.munge_socket.exists(), 10, 0.02)
    started.append(_record(rec, slurm.start_slurmctld(layout)))
    say("daemons starting: munged, slurmctld, prometheus" + (", node agents" if opts.agents else ""))

    deadline = time.monotonic() + opts.timeout_s
    if opts.agents:
        token = layout.token_file.read_text().strip()
        clients = {
            n.name: agents.AgentClient(layout.agent_socket(n.name), token, timeout=1) for n in layout.nodes
        }
        try:

            def agents_ready() -> bool:
                _check_alive(started)
                return all(c.healthy() for c in clients.values())

            wait_for("node agents' /healthz", agents_ready, deadline - time.monotonic(), 0.1)
        finally:
            for c in clients.values():
                c.close()
        timings.mark("agents")
    for n in layout.slurm_nodes:
        started.append(_record(rec, slurm.start_slurmd(layout, n.name)))
    serving = spec.sandbox.serving if spec.sandbox is not None and opts.serving else None
    if serving is not None:
        # The replicas load PyTorch while Slurm comes up; they are waited for at the end.
        for n in layout.serving_nodes:
            started.append(_record(rec, serving_start.start_replica(layout, n.name, serving, opts.python)))
        started.append(_record(rec, serving_start.start_balancer(layout, serving)))
        url, stats_url = serving_start.urls(layout, serving)
        rec.update(serving_url=url, serving_stats_url=stats_url,
                   serving_admin_socket=serving_start.admin_socket(layout))

    names = [n.name for n in layout.slurm_nodes]

    def nodes_idle() -> bool:
        _check_alive(started)
        return slurm.all_idle(slurm.node_states(layout.head.netns, layout.slurm_conf), names)

    wait_for("every node idle in sinfo", nodes_idle, deadline - time.monotonic(), 0.2)
    timings.mark("nodes_idle")
    say(f"slurm: {len(names)} nodes idle")

    port = prometheus.read_port(port_file, deadline)
    if port is None:
        raise SandboxError(
            f"the Prometheus forwarder wrote no port; see {layout.path('prometheus', 'forward.log')}"
        )
    url = f"http://127.0.0.1:{port}"
    client = PrometheusClient(url, timeout=2)
    try:
        wait_for("Prometheus ready", client.ready, deadline - time.monotonic(), 0.2)
    finally:
        client.close()
    rec.update(prometheus_url=url)
    timings.mark("prometheus")

    if relay_port_file is not None:
        port_file_written = relay_port_file

        def relay_listening() -> bool:
            _check_alive(started)
            return port_file_written.exists()

        wait_for("the S3 relay into the nodes' namespaces", relay_listening, deadline - time.monotonic(), 0.1)
    if opts.training:
        started.append(_record(rec, workload.start_controller(layout, opts.python)))
        rec.update(
            training_job_name=workload.job_name(layout),
            training_controller=str(workload.controller_status_file(layout)),
        )
        where = ""
        if layout.checkpoint_root:
            where = f" (checkpoints on the JuiceFS volume: {layout.checkpoint_dir})"
        elif link.job is not None:
            where = f" (checkpoints straight to S3: {link.job.url})"
        say("auto-resume controller started; it submits the training job" + where)

        def training_progressing() -> bool:
            _check_alive(started)
            return workload.progressing(workload.read_progress(layout.events_file))

        wait_for(
            f"training progress in {layout.events_file}",
            training_progressing,
            deadline - time.monotonic(),
            0.2,
        )
        timings.mark("training")
    if spec.dr is not None:  # backups of slurmctld's state, proven restorable (docs/storage.md, drill 3)
        interval = spec.dr.backup_interval_seconds
        started.append(_record(rec, slurm_state_backup.start(layout, rec.path, interval, opts.python)))
    if serving is not None:
        want = {n.name for n in layout.serving_nodes}
        _, stats_url = serving_start.urls(layout, serving)

        def replicas_up() -> bool:
            _check_alive(started)
            states = server_states(stats_url, layout.head.netns)
            # Without a health check HAProxy reports no state worth waiting for, only that it answers.
            return set(states) == want and (serving.health == "none" or set(states.values()) == {"UP"})

        wait_for(f"every replica UP in HAProxy ({stats_url})", replicas_up, deadline - time.monotonic(), 0.2)
        timings.mark("serving")
        say(f"serving: {len(want)} replicas behind HAProxy at {serving_start.urls(layout, serving)[0]}")
