"""`gpufleet sandbox status`: a running sandbox, read from its state file and checked live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.core.sandbox_contract import SandboxState
from gpufleet.sandbox import network, processes, slurm, workload


def status(state: SandboxState) -> dict[str, Any]:
    """Live facts about a sandbox: which recorded processes still run, namespaces present, Slurm
    node states (when the controller answers) and training progress."""
    procs = {p.name: processes.alive(p) for p in state.processes}
    have_ns = network.existing_netns()
    nodes: dict[str, dict[str, Any]] = {}
    if state.head_netns in have_ns and state.slurm_conf:
        for name, ns in slurm.node_states(state.head_netns, Path(state.slurm_conf)).items():
            nodes[name] = {"state": ns.base_state, "responding": ns.responding, "reason": ns.reason}
    jobs = (
        [j.__dict__ for j in slurm.jobs(state.head_netns, Path(state.slurm_conf))]
        if state.head_netns in have_ns and state.slurm_conf
        else []
    )
    prog = workload.read_progress(Path(state.training_events)) if state.training_events else None
    return {
        "stack": state.stack,
        "run_id": state.run_id,
        "phase": state.phase,
        "base_dir": state.base_dir,
        "prometheus_url": state.prometheus_url,
        "namespaces_present": sum(1 for ns in state.namespaces if ns in have_ns),
        "namespaces_recorded": len(state.namespaces),
        "processes": procs,
        "slurm_nodes": nodes,
        "jobs": jobs,
        "training": None
        if prog is None
        else {
            "max_step": prog.max_step,
            "restarts": prog.restarts,
            "last_t": prog.last_t,
        },
    }
