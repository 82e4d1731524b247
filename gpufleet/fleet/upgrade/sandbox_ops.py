"""The Slurm sandbox as a rollout sees it: the commands that perform the state machine's actions and
the parsers that read the fleet back (pure; `sandbox_driver` runs them).

The sandbox is reached only through its contract (gpufleet.core.sandbox_contract): Slurm commands run
in the head namespace with SLURM_CONF, each node's daemons are restarted from their recorded Launch
recipes, the node agent answers GET /state on its control socket.
"""

from __future__ import annotations

import json
import sys

from gpufleet.core.sandbox_contract import Launch, SandboxNode, SandboxState
from gpufleet.core.slurm_state import NodeObs, expand_hostlist, parse_slurm_time
from gpufleet.fleet.upgrade.model import Component, Job

# `squeue -h -o <SQUEUE_FORMAT>`: job id, name, partition, state, nodes (squeue(1): %i %j %P %T %N).
SQUEUE_FORMAT = "%i|%j|%P|%T|%N"
# States in which a job still holds its nodes: running, or completing (its Epilog runs; restarting
# slurmd under it would cut that short).
HOLDING_STATES = "RUNNING,COMPLETING,CONFIGURING"

# The agent option that carries each component's version (gpufleet.sandbox.agent.cli).
VERSION_OPTION = {Component.DRIVER: "--driver-version", Component.FIRMWARE: "--firmware-version"}
STATE_KEY = {Component.DRIVER: "driver_version", Component.FIRMWARE: "firmware_version"}


def cordon_argv(state: SandboxState, node: str, reason: str) -> list[str]:
    """Drain: running jobs may finish (or be cancelled), no new job is placed (scontrol(1))."""
    return state.slurm_command("scontrol", "update", f"nodename={node}", "state=DRAIN", f"reason={reason}")


def hold_argv(state: SandboxState, node: str, reason: str) -> list[str]:
    """Keep the node drained, its reason replaced by what went wrong (no longer the rollout's mark)."""
    return cordon_argv(state, node, reason)


def resume_argv(state: SandboxState, node: str) -> list[str]:
    return state.slurm_command("scontrol", "update", f"nodename={node}", "state=RESUME")


def cancel_argv(state: SandboxState, job_ids: tuple[str, ...]) -> list[str]:
    """The sandbox's training jobs are submitted with --no-requeue: a cancelled incarnation is
    resubmitted by the auto-resume controller as a new job that resumes from the latest checkpoint,
    so cancelling is how the sandbox 'requeues' (gpufleet.sandbox.training.autoresume)."""
    return state.slurm_command("scancel", *job_ids)


def squeue_argv(state: SandboxState) -> list[str]:
    return state.slurm_command("squeue", "-h", "-t", HOLDING_STATES, "-o", SQUEUE_FORMAT)


def show_node_argv(state: SandboxState, node: str) -> list[str]:
    return state.slurm_command("scontrol", "-o", "show", "node", node)


def slurmd_start_time(text: str) -> float | None:
    """SlurmdStartTime of `scontrol -o show node` (local time, Unix seconds): when the node's
    slurmd last registered. A restarted slurmd has registered once it is later than the restart;
    before that, sinfo may still show the old daemon's state."""
    for tok in text.split():
        if tok.startswith("SlurmdStartTime="):
            return parse_slurm_time(tok.split("=", 1)[1])
    return None




def parse_squeue(text: str) -> dict[str, list[Job]]:
    """Node -> the jobs holding it (SQUEUE_FORMAT lines)."""
    out: dict[str, list[Job]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0]:
            continue
        job_id, name, partition, _state, nodes = parts
        for node in expand_hostlist(nodes):
            out.setdefault(node, []).append(Job(id=job_id, name=name, queue=partition))
    return out


def with_option(program: list[str], option: str, value: str) -> list[str]:
    """`program` with `option value` set: replaced where present, appended otherwise."""
    out = list(program)
    if option in out:
        i = out.index(option)
        if i + 1 >= len(out):
            raise ValueError(f"{option} has no value in {program}")
        out[i + 1] = value
        return out
    return [*out, option, value]


def option_value(program: list[str], option: str) -> str | None:
    if option in program:
        i = program.index(option)
        return program[i + 1] if i + 1 < len(program) else None
    return None


def upgraded_recipe(recipe: Launch, component: Component, version: str) -> Launch:
    """The node agent's recipe with the component's version replaced: what the 'reboot' starts."""
    program = with_option(recipe.program, VERSION_OPTION[component], version)
    return recipe.model_copy(update={"program": program})


def health_argv(state: SandboxState, node: SandboxNode, agent: Launch,
                python: str = sys.executable) -> list[str]:
    """The sandbox's node health check (what slurmd runs as HealthCheckProgram, gpufleet/sandbox/
    templates/healthcheck.sh.j2) run once inside the node's namespace, without --slurm-drain: the
    rollout decides what a failure means. It waits for a periodic check that holds the node's lock."""
    if node.agent_socket is None or state.agent_token_file is None:
        raise ValueError(f"node {node.name} has no agent control socket in the state file")
    argv = ["ip", "netns", "exec", node.netns, python, "-m", "gpufleet.health", "--sandbox",
            "--node", node.name, "--agent-socket", node.agent_socket, "--token-file", state.agent_token_file,
            "--anchor-ifname", node.mgmt_ifname, "--format", "json", "--wait-lock", "15"]
    overrides = option_value(agent.program, "--xid-overrides")
    if overrides is not None:
        argv += ["--xid-overrides", overrides]
    return argv


# The smoke run's own deadline, well below the driver's command timeout (sandbox_driver.COMMAND_TIMEOUT_S,
# 30 s: the ranks' stop and the judging come after it) so the run always answers. Measured: the whole
# run takes 1.8-2.6 s on these 2-core machines under a Go build (torch's import is most of it).
SMOKE_DEADLINE_S = 20.0


def smoke_argv(state: SandboxState, node: SandboxNode, ranks: int, python: str = sys.executable) -> list[str]:
    """The gate's one-step training smoke run (gpufleet.sandbox.training.smoke) inside the node's
    namespace, with the job's ranks per node each holding every GPU of the node."""
    if state.training_hosts_file is None:
        raise ValueError(f"sandbox {state.stack} has no training hosts file in its state (brought up "
                         "by an older gpufleet): bring it up again for a smoke run")
    return ["ip", "netns", "exec", node.netns, python, "-m", "gpufleet.sandbox.training.smoke",
            "--node", node.name, "--ranks", str(ranks), "--gpus", str(node.gpus),
            "--base-dir", state.base_dir, "--hosts-file", state.training_hosts_file,
            "--deadline", f"{SMOKE_DEADLINE_S:g}"]


def smoke_result(returncode: int, stdout: str, stderr: str) -> tuple[bool, str]:
    """The smoke run's verdict from its exit code and its JSON line (pure)."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
        passed, detail = doc["passed"] is True, str(doc["detail"])
    except (IndexError, ValueError, KeyError, TypeError):
        return False, f"smoke run rc {returncode}: {(stderr or stdout).strip()[-300:]}"
    return passed and returncode == 0, f"{detail} in {doc.get('seconds', '?')} s"


def cordoned_by(obs: NodeObs | None, own_marks: frozenset[str]) -> str | None:
    """Who holds a node out of service, from sinfo: None when it is schedulable (or is held by a
    mark in `own_marks`, this run's); otherwise the reason (a person's, remediation's, another
    rollout's), or its state when it has none (a down node)."""
    if obs is None:
        return "not known to Slurm"
    if obs.schedulable:
        return None
    if obs.reason in own_marks:
        return None
    return obs.reason or obs.state
